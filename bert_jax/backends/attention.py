"""Self-attention's one dispatch: `attend` runs the implementation `backends.attention_plan`
chooses for the config (explicit softmax, jax.nn.dot_product_attention's 'xla' or 'cudnn', or
the Pallas flash kernels), all with BERT's mask and, where attention dropout is active, the
config's dropout masks. The model calls `attend` and nothing else of these.

Shape key: B batch, Q query positions, S key positions, H heads, K head dim.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import backends
from bert_jax import sharding as sh
from bert_jax.backends import dropout, flash
from bert_jax.model_config import BertConfig

Array = jax.Array


def attention_mask(
  input_mask_BS: Array, causal: bool, query_positions_BQ: Array | None = None
) -> Array:
  """Boolean [B, 1, Q, S]: the query at position query_positions[b, q] (default: every
  position, Q = S) may attend key s. Padding keys are never attended; causal: nor later keys."""
  keys_S = jnp.arange(input_mask_BS.shape[1])
  if query_positions_BQ is None:
    query_positions_BQ = jnp.broadcast_to(keys_S, input_mask_BS.shape)
  mask_B1QS = jnp.broadcast_to(
    input_mask_BS.astype(bool)[:, None, None, :],
    (input_mask_BS.shape[0], 1, query_positions_BQ.shape[1], input_mask_BS.shape[1]),
  )
  if causal:
    mask_B1QS = mask_B1QS & (query_positions_BQ[:, None, :, None] >= keys_S)
  return mask_B1QS


def attend(
  cfg: BertConfig,
  q_BQHK: Array,
  k_BSHK: Array,
  v_BSHK: Array,
  input_mask_BS: Array,
  positions_BQ: Array | None = None,
  *,
  deterministic: bool = True,
  output_attentions: bool = False,
) -> tuple[Array, Array | None]:
  """Softmax attention of the queries (at `positions_BQ`, default every position) over the
  keys where `input_mask_BS` is 1 (and, with cfg.causal, at or before the query's position):
  ([B, Q, H, K] in q's dtype, the float32 [B, H, Q, S] probabilities if `output_attentions`).
  With attention dropout active (not `deterministic`) the probabilities are dropped out by a
  `dropout.Dropout` made here, in the caller's module."""
  dropping = not deterministic and cfg.attention_dropout_prob > 0
  impl = backends.attention_choice(cfg, k_BSHK.shape[1], dropping, output_attentions)
  drop = dropout.for_config(cfg, cfg.attention_dropout_prob) if dropping else None
  if impl == "flash":
    return flash_attention(cfg, q_BQHK, k_BSHK, v_BSHK, input_mask_BS, positions_BQ, drop), None
  mask_B1QS = attention_mask(input_mask_BS, cfg.causal, positions_BQ)
  if impl in ("explicit", "explicit_lowp"):
    ops = backends.ops_for(cfg)
    lowp = impl == "explicit_lowp"
    return explicit_attention(q_BQHK, k_BSHK, v_BSHK, mask_B1QS, ops, drop, lowp)
  if dropping:
    raise ValueError(f"attention_impl={impl!r} has no attention dropout")
  return library_attention(q_BQHK, k_BSHK, v_BSHK, mask_B1QS, impl), None


def explicit_attention(
  q_BQHK: Array,
  k_BSHK: Array,
  v_BSHK: Array,
  mask_B1QS: Array,
  ops: backends.Ops,
  drop: dropout.Dropout | None = None,
  lowp: bool = False,
) -> tuple[Array, Array | None]:
  """Softmax attention with the probabilities materialised: (context, probabilities).

  Logits and softmax are float32 whatever the compute dtype; `drop` (if given) is applied to
  the probabilities. With `lowp` and a compute dtype below float32 the probabilities are kept
  in that dtype (`attention_probs`: same forward values, a low-precision backward) and not
  returned (None).
  """
  logits_BHQS = ops.scores(q_BQHK, k_BSHK) / jnp.sqrt(jnp.float32(q_BQHK.shape[-1]))
  logits_BHQS = jnp.where(mask_B1QS, logits_BHQS, jnp.finfo(jnp.float32).min)
  if lowp and q_BQHK.dtype != jnp.float32:
    keep_BHQS = None if drop is None else drop.keep_mask(logits_BHQS.shape)
    rate = 0.0 if drop is None else drop.rate
    dropped_BHQS = attention_probs(logits_BHQS, q_BQHK.dtype, keep_BHQS, rate)
    ctx_BQHK = ops.context(dropped_BHQS, v_BSHK)
    return ctx_BQHK.astype(q_BQHK.dtype), None
  probs_BHQS = jax.nn.softmax(logits_BHQS, axis=-1)
  dropped_BHQS = probs_BHQS if drop is None else drop(probs_BHQS, deterministic=False)
  ctx_BQHK = ops.context(dropped_BHQS.astype(q_BQHK.dtype), v_BSHK)
  return ctx_BQHK.astype(q_BQHK.dtype), probs_BHQS


def library_attention(
  q_BQHK: Array, k_BSHK: Array, v_BSHK: Array, mask_B1QS: Array, implementation: str
) -> Array:
  """jax.nn.dot_product_attention with `implementation` ('xla' or 'cudnn'), no dropout.

  cuDNN's fused attention with a mask (passed as a bias) needs even query and key lengths
  when training: an odd query length (a pruned last layer's 1 + P positions) gets one padding
  query, sliced off again; an odd key length falls back to 'xla'."""
  if implementation == "cudnn":
    q_len, k_len = q_BQHK.shape[1], k_BSHK.shape[1]
    if k_len % 2:
      implementation = "xla"
    elif q_len % 2:
      q_BQHK = jnp.pad(q_BQHK, ((0, 0), (0, 1), (0, 0), (0, 0)))
      mask_B1QS = jnp.pad(mask_B1QS, ((0, 0), (0, 0), (0, 1), (0, 0)))
      ctx_BQHK = jax.nn.dot_product_attention(
        q_BQHK, k_BSHK, v_BSHK, mask=mask_B1QS, implementation="cudnn"
      )
      return ctx_BQHK[:, :q_len]
  return jax.nn.dot_product_attention(
    q_BQHK, k_BSHK, v_BSHK, mask=mask_B1QS, implementation=implementation
  )


def flash_attention(
  cfg: BertConfig,
  q_BQHK: Array,
  k_BSHK: Array,
  v_BSHK: Array,
  input_mask_BS: Array,
  positions_BQ: Array | None,
  drop: dropout.Dropout | None,
) -> Array:
  """attention_impl='flash': flash.py's Pallas kernels (Triton on a GPU, Pallas' interpreter on
  the CPU), equal to 'explicit' with the 'hash' dropout mask whatever `dropout_rng` (the seeds
  are those `drop.keep_mask` would hash with), run per shard of the batch and head axes the
  logical rules place."""
  interpret = backends.flash_interpret(cfg)
  batch_axes, head_axes = nn.logical_to_mesh_axes((sh.ACT_BATCH, sh.ACT_HEADS))
  return flash.flash_attention(
    q_BQHK,
    k_BSHK,
    v_BSHK,
    input_mask_BS,
    causal=cfg.causal,
    query_positions_BQ=positions_BQ,
    dropout_rate=0.0 if drop is None else drop.rate,
    dropout_seed=None if drop is None else drop.hash_seed(),
    interpret=interpret,
    batch_axes=batch_axes,
    head_axes=head_axes,
  )


# ----------------------------------------------------------------------------- explicit_lowp


def attention_probs(
  logits: Array, dtype: Any, keep: Array | None = None, rate: float = 0.0
) -> Array:
  """softmax(logits) over the last axis, dropped out where `keep` is False (the kept ones
  scaled by 1 / (1 - rate)), in `dtype`.

  The forward is jax.nn.softmax in float32 and the dropout in float32, then one cast: the
  values equal `dropout(softmax(logits)).astype(dtype)`. The custom VJP keeps only the
  probabilities in `dtype` and the mask for the backward, where autodiff keeps them in float32,
  and computes dlogits = p * (g - sum(g * p)) in float32 from them: equal to autodiff's up to
  `dtype`'s rounding of p."""
  dtype = jnp.dtype(dtype)
  if keep is None:
    return _probs(logits, dtype)
  return _dropped_probs(logits, keep, dtype, 1.0 - rate)


def _softmax_bwd(p: Array, g: Array) -> Array:
  p32 = p.astype(jnp.float32)
  return p32 * (g - jnp.sum(g * p32, axis=-1, keepdims=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _probs(logits: Array, dtype) -> Array:
  return jax.nn.softmax(logits, axis=-1).astype(dtype)


def _probs_fwd(logits, dtype):
  p = _probs(logits, dtype)
  return p, p


def _probs_bwd(dtype, p, g):
  return (_softmax_bwd(p, g.astype(jnp.float32)),)


_probs.defvjp(_probs_fwd, _probs_bwd)


def _drop_probs(p: Array, keep: Array, keep_prob: float) -> Array:
  return jnp.where(keep, p / keep_prob, jnp.zeros((), p.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dropped_probs(logits: Array, keep: Array, dtype, keep_prob: float) -> Array:
  return _drop_probs(jax.nn.softmax(logits, axis=-1), keep, keep_prob).astype(dtype)


def _dropped_fwd(logits, keep, dtype, keep_prob):
  p = jax.nn.softmax(logits, axis=-1)
  return _drop_probs(p, keep, keep_prob).astype(dtype), (p.astype(dtype), keep)


def _dropped_bwd(dtype, keep_prob, res, g):
  p, keep = res
  return _softmax_bwd(p, _drop_probs(g.astype(jnp.float32), keep, keep_prob)), None


_dropped_probs.defvjp(_dropped_fwd, _dropped_bwd)
