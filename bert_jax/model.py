"""BERT (Devlin et al. 2019) in Flax linen, faithful to the released models and sharded by
logical axes.

Post-LN Transformer encoder, exact-erf GELU, LayerNorm eps 1e-12, truncated-normal init
(std 0.02), learned positions, 2 token types, tanh pooler, MLM head (dense + GELU + LayerNorm,
decoder tied to the word embeddings plus an output bias) evaluated only at the gathered masked
positions, and a 2-way NSP head. Parameter names map 1:1 onto HuggingFace's
`BertForPreTraining` (see convert.py).

The hyper-parameters are `BertConfig` (model_config.py). The layers are written once, in
stock Flax/XLA ops; what a backend swaps in is asked of backends.py: the array ops
(`backends.ops_for`: `BertConfig.kernels='cpu'` is the XLA:CPU speed kernels of kernels.py, same
values, gradients and parameters), the dropout keep-masks (`dropout_rng`) and the attention
(`attention_impl`), whose 'auto' values come from measurements per backend.

Embedding lookups read the float32 (param_dtype) tables and cast after: the word gather's
gradient is then a float32 scatter-add, the 2-row token-type table is a select and positions a
slice, so no gradient is a low-precision scatter-add (on GPUs its atomics serialise).

Shape key: B batch, L sequence length, Q query positions (L, or the positions a pruned last
layer computes), S key positions (= L), D hidden, H heads, K head dim, F intermediate (FFN),
V vocab, P predicted positions, N layers. A 1 is a size-1 axis.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from bert_jax import backends, kernels
from bert_jax import flash_attention as flash_lib
from bert_jax import sharding as sh

# The config, its sizes (model_config.py) and the per-backend choices (backends.py) have rooms
# of their own; their names stay importable from here, as configs, tools and users spell them.
from bert_jax.backends import (  # noqa: F401
  AUTO_ATTENTION,
  CPU_OPS,
  DEFAULT_ATTENTION,
  DROPOUT_RNG_AUTO,
  KEEP_MASKS,
  XLA_OPS,
  Ops,
  attention_choice,
  ops_for,
  platform_family,
  resolve_kernels,
  resolved,
)
from bert_jax.model_config import (  # noqa: F401
  ATTENTION_IMPLS,
  DROPOUT_RNGS,
  KERNELS,
  REMAT_POLICIES,
  SIZES,
  BertConfig,
  config_for_size,
  size_fields,
)

Array = jax.Array

# ----------------------------------------------------------------------------- building blocks


def gelu(x: Array) -> Array:
  """BERT's exact (erf) GELU, not the tanh approximation."""
  return jax.nn.gelu(x, approximate=False)


def _init(cfg: BertConfig, names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
    nn.initializers.truncated_normal(stddev=cfg.initializer_range), names
  )


def _zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


class Dense(nn.Module):
  """x[..., *in] @ kernel[*in, *features] + bias[*features], in the compute dtype.

  The kernel keeps its N-d shape (e.g. [D, H, K] for a query projection) so that every dim
  carries a logical axis name; nn.DenseGeneral's flat kernel cannot be partitioned that way.
  """

  features: tuple[int, ...]
  axes: tuple[str | None, ...]  # logical names of the kernel dims (inputs then outputs)
  cfg: BertConfig
  contract: int = 1  # how many trailing dims of x are contracted

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.cfg
    in_shape = x.shape[x.ndim - self.contract :]
    kernel = self.param(
      "kernel", _init(cfg, self.axes), (*in_shape, *self.features), cfg.storage_dtype
    )
    bias = self.param("bias", _zeros(self.axes[self.contract :]), self.features, cfg.storage_dtype)
    ops = backends.ops_for(cfg)
    return ops.add_bias(ops.matmul(x, kernel, self.contract, cfg.compute_dtype), bias)


def layer_norm(cfg: BertConfig, name: str) -> nn.Module:
  """LayerNorm over the hidden axis (statistics in float32), params `scale` and `bias`."""
  return backends.ops_for(cfg).layer_norm(
    epsilon=cfg.layer_norm_eps,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.storage_dtype,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (sh.EMBED,)),
    bias_init=_zeros((sh.EMBED,)),
    name=name,
  )


class Dropout(nn.Module):
  """Inverted dropout with the 'dropout' rng collection, as flax's nn.Dropout (with 'threefry'
  the same masks and values), keep-masks drawn by `backends.KEEP_MASKS[rng]`."""

  rate: float
  rng_impl: str = "threefry"  # a resolved BertConfig.dropout_rng

  def keep_mask(self, shape: tuple[int, ...]) -> Array:
    """The keep-mask for an input of `shape`."""
    return backends.KEEP_MASKS[self.rng_impl](self.make_rng("dropout"), shape, self.rate)

  def hash_seed(self) -> Array:
    """The seed words of the 'hash' mask `keep_mask` would draw (whatever rng_impl): for
    kernels that hash their own tiles (attention_impl='flash')."""
    return kernels.hash_seed(self.make_rng("dropout"))

  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    return kernels.dropout(x, self.keep_mask(x.shape), self.rate)


def dropout(cfg: BertConfig, rate: float) -> Dropout:
  return Dropout(rate, backends.resolved(cfg).dropout_rng)


def gather_positions(x_BL: Array, positions_BP: Array) -> Array:
  """x[B, L, ...] at positions[B, P] -> [B, P, ...]."""
  idx = positions_BP.astype(jnp.int32).reshape(positions_BP.shape + (1,) * (x_BL.ndim - 2))
  return jnp.take_along_axis(x_BL, idx, axis=1)


# ----------------------------------------------------------------------------- embeddings


def embedding_lookup(table_VD: Array, ids_BL: Array, dtype: Any) -> Array:
  """Rows `ids` of a (float32) table, cast to `dtype` after the gather, so the gradient is a
  scatter-add in the table's dtype. (nn.Embed casts the table first: its gradient is then a
  bf16 scatter-add, whose atomics serialise on GPUs.) Values equal nn.Embed's."""
  return jnp.take(table_VD, ids_BL, axis=0).astype(dtype)


def small_table_lookup(table_TD: Array, ids_BL: Array, dtype: Any) -> Array:
  """Rows `ids` of a table of a few rows (token types) by selects: the gradient is a masked
  sum per row, not a scatter-add of every token onto 2 rows. Ids outside the table read row 0
  (a gather would give NaN)."""
  rows = table_TD.shape[0]
  out_BLD = jnp.broadcast_to(table_TD[0], (*ids_BL.shape, table_TD.shape[1]))
  for t in range(1, rows):
    out_BLD = jnp.where((ids_BL == t)[..., None], table_TD[t], out_BLD)
  return out_BLD.astype(dtype)


# Up to this many rows a table is read by selects (`small_table_lookup`), above by a gather.
SMALL_TABLE_ROWS = 16


class Embeddings(nn.Module):
  """Word + learned position + token type embeddings, LayerNorm, dropout.

  The tables are nn.Embed parameters (names, shapes and init as HuggingFace's), read by
  `embedding_lookup`, a slice (positions) and `small_table_lookup` (token types)."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    # setup (not compact) so BertForPreTraining can tie the MLM decoder to this table.
    self.word_embeddings = nn.Embed(
      cfg.vocab_size,
      cfg.hidden_size,
      embedding_init=_init(cfg, (sh.VOCAB, sh.EMBED)),
      param_dtype=cfg.storage_dtype,
      dtype=cfg.compute_dtype,
    )
    self.position_embeddings = nn.Embed(
      cfg.max_position_embeddings,
      cfg.hidden_size,
      embedding_init=_init(cfg, (None, sh.EMBED)),
      param_dtype=cfg.storage_dtype,
      dtype=cfg.compute_dtype,
    )
    self.token_type_embeddings = nn.Embed(
      cfg.type_vocab_size,
      cfg.hidden_size,
      embedding_init=_init(cfg, (None, sh.EMBED)),
      param_dtype=cfg.storage_dtype,
      dtype=cfg.compute_dtype,
    )
    self.LayerNorm = layer_norm(cfg, "LayerNorm")
    self.dropout = dropout(cfg, cfg.hidden_dropout_prob)

  def __call__(self, input_ids_BL: Array, segment_ids_BL: Array, deterministic: bool) -> Array:
    cfg = self.cfg
    length = input_ids_BL.shape[1]
    if length > cfg.max_position_embeddings:
      raise ValueError(
        f"sequence length {length} exceeds max_position_embeddings {cfg.max_position_embeddings}"
      )
    dtype = cfg.compute_dtype
    x_BLD = embedding_lookup(self.word_embeddings.embedding, input_ids_BL, dtype)
    x_BLD = x_BLD + self.position_embeddings.embedding[:length].astype(dtype)[None]
    types_TD = self.token_type_embeddings.embedding
    if types_TD.shape[0] <= SMALL_TABLE_ROWS:
      x_BLD = x_BLD + small_table_lookup(types_TD, segment_ids_BL, dtype)
    else:
      x_BLD = x_BLD + embedding_lookup(types_TD, segment_ids_BL, dtype)
    x_BLD = self.LayerNorm(x_BLD)
    x_BLD = self.dropout(x_BLD, deterministic=deterministic)
    return _constrain(x_BLD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

  def attend(self, h_BPD: Array) -> Array:
    """Logits against the word embeddings (the tied MLM decoder), in float32, [B, P, V].

    The product runs on the table padded with zero rows to `backends.vocab_rows` (on a GPU a
    multiple of 128, the dots' aligned tiles), and its padded columns are sliced off before
    anything reads them: no padded row takes probability or wins an argmax, and the
    parameters keep V rows."""
    table_VD = self.word_embeddings.embedding
    vocab = table_VD.shape[0]
    rows = backends.vocab_rows(self.cfg, vocab)
    if rows != vocab:
      table_VD = jnp.pad(table_VD, ((0, rows - vocab), (0, 0)))
    logits_BPV = backends.ops_for(self.cfg).logits(h_BPD, table_VD, self.cfg.compute_dtype)
    return logits_BPV[..., :vocab]


# ----------------------------------------------------------------------------- attention


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


def explicit_attention(
  q_BQHK: Array,
  k_BSHK: Array,
  v_BSHK: Array,
  mask_B1QS: Array,
  ops: backends.Ops,
  drop: Dropout | None = None,
  lowp: bool = False,
) -> tuple[Array, Array | None]:
  """Softmax attention with the probabilities materialised: (context, probabilities).

  Logits and softmax are float32 whatever the compute dtype; `drop` (if given) is applied to
  the probabilities. With `lowp` and a compute dtype below float32 the probabilities are kept
  in that dtype (`kernels.attention_probs`: same forward values, a low-precision backward) and
  not returned (None).
  """
  logits_BHQS = ops.scores(q_BQHK, k_BSHK) / jnp.sqrt(jnp.float32(q_BQHK.shape[-1]))
  logits_BHQS = jnp.where(mask_B1QS, logits_BHQS, jnp.finfo(jnp.float32).min)
  if lowp and q_BQHK.dtype != jnp.float32:
    keep_BHQS = None if drop is None else drop.keep_mask(logits_BHQS.shape)
    rate = 0.0 if drop is None else drop.rate
    dropped_BHQS = kernels.attention_probs(logits_BHQS, q_BQHK.dtype, keep_BHQS, rate)
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
  drop: Dropout | None,
) -> Array:
  """attention_impl='flash': flash_attention.py's Pallas kernels (Triton on a GPU, Pallas'
  interpreter on the CPU), equal to 'explicit' with the 'hash' dropout mask whatever
  `dropout_rng` (the seeds are those `drop.keep_mask` would hash with), run per shard of the
  batch and head axes the logical rules place."""
  interpret = backends.flash_interpret(cfg)
  batch_axes, head_axes = nn.logical_to_mesh_axes((sh.ACT_BATCH, sh.ACT_HEADS))
  return flash_lib.flash_attention(
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


def self_attention(
  cfg: BertConfig,
  xq_BQD: Array,
  x_BSD: Array,
  mask_B1QS: Array,
  deterministic: bool,
  output_attentions: bool,
  input_mask_BS: Array | None = None,
  positions_BQ: Array | None = None,
) -> tuple[Array, Array | None]:
  """Multi-head self-attention with queries from `xq_BQD`, keys and values from `x_BSD`,
  then the output projection: ([B, Q, D], the probabilities when asked for, else None).
  The implementation is `attention_choice`'s; 'flash' reads the compact mask (`input_mask_BS`,
  the queries' `positions_BQ`, cfg.causal), the others `mask_B1QS`.

  Called inside `Layer`, whose params (`query`, `key`, `value`, `attention_output`) these are.
  """
  h, k = cfg.num_heads, cfg.head_dim
  qkv_axes = (sh.EMBED, sh.HEADS, sh.KV)
  act = (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_HEADS, sh.ACT_KV)
  q_BQHK = _constrain(Dense((h, k), qkv_axes, cfg, name="query")(xq_BQD), act)
  k_BSHK = _constrain(Dense((h, k), qkv_axes, cfg, name="key")(x_BSD), act)
  v_BSHK = _constrain(Dense((h, k), qkv_axes, cfg, name="value")(x_BSD), act)

  dropping = not deterministic and cfg.attention_dropout_prob > 0
  impl = backends.attention_choice(cfg, x_BSD.shape[1], dropping, output_attentions)
  probs_BHQS = None
  drop = dropout(cfg, cfg.attention_dropout_prob) if dropping else None
  if impl in ("explicit", "explicit_lowp"):
    ctx_BQHK, probs_BHQS = explicit_attention(
      q_BQHK, k_BSHK, v_BSHK, mask_B1QS, backends.ops_for(cfg), drop, lowp=impl == "explicit_lowp"
    )
  elif impl == "flash":
    if input_mask_BS is None:
      raise ValueError("attention_impl='flash' needs the input mask (input_mask_BS)")
    ctx_BQHK = flash_attention(cfg, q_BQHK, k_BSHK, v_BSHK, input_mask_BS, positions_BQ, drop)
  elif dropping:
    raise ValueError(f"attention_impl={impl!r} has no attention dropout")
  else:
    ctx_BQHK = library_attention(q_BQHK, k_BSHK, v_BSHK, mask_B1QS, impl)
  ctx_BQHK = _constrain(ctx_BQHK, act)
  out_BQD = Dense(
    (cfg.hidden_size,), (sh.HEADS, sh.KV, sh.EMBED), cfg, contract=2, name="attention_output"
  )(ctx_BQHK)
  return out_BQD, (probs_BHQS if output_attentions else None)


# ----------------------------------------------------------------------------- layer


class Layer(nn.Module):
  """One post-LN Transformer layer (self-attention, FFN), as the original BERT."""

  cfg: BertConfig
  deterministic: bool = True
  output_attentions: bool = False

  @nn.compact
  def __call__(
    self,
    x_BLD: Array,
    mask_B1QS: Array,
    positions_BQ: Array | None = None,
    input_mask_BL: Array | None = None,
  ) -> tuple[Array, Array | None]:
    """[B, L, D] -> [B, Q, D]: with `positions_BQ` only those positions' outputs (the queries,
    attention output and FFN run at the Q gathered positions, keys and values at all L),
    else Q = L. `input_mask_BL`: the mask `mask_B1QS` was made from (attention_impl='flash')."""
    cfg = self.cfg
    xq_BQD = x_BLD if positions_BQ is None else gather_positions(x_BLD, positions_BQ)
    attn_BQD, probs_BHQS = self_attention(
      cfg,
      xq_BQD,
      x_BLD,
      mask_B1QS,
      self.deterministic,
      self.output_attentions,
      input_mask_BL,
      positions_BQ,
    )
    attn_BQD = dropout(cfg, cfg.hidden_dropout_prob)(attn_BQD, deterministic=self.deterministic)
    x_BQD = layer_norm(cfg, "attention_LayerNorm")(attn_BQD + xq_BQD)
    x_BQD = _constrain(x_BQD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

    ff_BQF = Dense((cfg.intermediate_size,), (sh.EMBED, sh.MLP), cfg, name="intermediate")(x_BQD)
    ff_BQF = _constrain(gelu(ff_BQF), (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_MLP))
    ff_BQD = Dense((cfg.hidden_size,), (sh.MLP, sh.EMBED), cfg, name="output")(ff_BQF)
    ff_BQD = dropout(cfg, cfg.hidden_dropout_prob)(ff_BQD, deterministic=self.deterministic)
    x_BQD = layer_norm(cfg, "output_LayerNorm")(ff_BQD + x_BQD)
    x_BQD = _constrain(x_BQD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))
    return x_BQD, probs_BHQS


# ----------------------------------------------------------------------------- encoder


class _ScanLayer(nn.Module):
  """Layer with the (carry, per-step output) signature nn.scan needs."""

  cfg: BertConfig
  deterministic: bool = True
  output_hidden_states: bool = False
  output_attentions: bool = False

  @nn.compact
  def __call__(self, x_BLD: Array, mask_B1LS: Array, input_mask_BL: Array):
    layer_cls = _maybe_remat(Layer, self.cfg, prevent_cse=False)
    x_BLD, probs_BHLS = layer_cls(
      self.cfg, self.deterministic, self.output_attentions, name="layer"
    )(x_BLD, mask_B1LS, None, input_mask_BL)
    return x_BLD, (x_BLD if self.output_hidden_states else None, probs_BHLS)


def _maybe_remat(cls, cfg: BertConfig, prevent_cse: bool):
  if cfg.remat_policy == "none":
    return cls
  return nn.remat(cls, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=prevent_cse)


def _scan(length: int):
  """nn.scan of `length` _ScanLayers: params `layer/...` with a leading layer axis."""
  return nn.scan(
    _ScanLayer,
    variable_axes={"params": 0},
    split_rngs={"params": True, "dropout": True},
    in_axes=(nn.broadcast, nn.broadcast),
    length=length,
    metadata_params={nn.PARTITION_NAME: sh.LAYERS},
  )


class _ScanThenLast(nn.Module):
  """The first N - 1 layers scanned (`scan`), then the last on its own (`last`) at the
  positions asked for: `_scan_then_last` gives it the scanned layers' parameters."""

  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BLD, mask_B1LS, mask_B1QS, positions_BQ, input_mask_BL):
    cfg = self.cfg
    x_BLD, _ = _scan(cfg.num_layers - 1)(cfg, self.deterministic, name="scan")(
      x_BLD, mask_B1LS, input_mask_BL
    )
    layer_cls = _maybe_remat(Layer, cfg, prevent_cse=True)
    x_BQD, _ = layer_cls(cfg, self.deterministic, name="last")(
      x_BLD, mask_B1QS, positions_BQ, input_mask_BL
    )
    return x_BQD


def _is_box(x) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def _split_last(variables):
  """{"layer": [N, ...] leaves} -> {"scan": {"layer": the first N - 1}, "last": the N-th}
  (boxed leaves keep their logical names, the last without the layer axis)."""
  tree = variables.get("params")
  if not tree or "layer" not in tree:
    return variables
  first = lambda x: x.replace_boxed(x.unbox()[:-1]) if _is_box(x) else x[:-1]
  last = lambda x: x.replace(value=x.value[-1], names=x.names[1:]) if _is_box(x) else x[-1]
  return {
    **variables,
    "params": {
      "scan": {"layer": jax.tree.map(first, tree["layer"], is_leaf=_is_box)},
      "last": jax.tree.map(last, tree["layer"], is_leaf=_is_box),
    },
  }


def _join_last(variables):
  """`_split_last`'s inverse: the scanned layers' layout, `layer/...` [N, ...]."""
  tree = variables.get("params")
  if not tree or "scan" not in tree:
    return variables

  def stack(a, b):
    if _is_box(a):
      return a.replace_boxed(jnp.concatenate([a.unbox(), b.unbox()[None]]))
    return jnp.concatenate([a, b[None]])

  layer = jax.tree.map(stack, tree["scan"]["layer"], tree["last"], is_leaf=_is_box)
  return {**variables, "params": {"layer": layer}}


def _scan_then_last(initializing: bool):
  """_ScanThenLast on the parameters of an N-layer `_scan`: the same tree, so a checkpoint
  of scanned layers runs either way."""
  return nn.map_variables(
    _ScanThenLast,
    "params",
    trans_in_fn=_split_last,
    trans_out_fn=_join_last,
    init=initializing,
    mutable=initializing,
  )


class Encoder(nn.Module):
  """N layers, unrolled (`layer_{i}`) or scanned (`layers/layer`, leading layer axis)."""

  cfg: BertConfig

  @nn.compact
  def __call__(
    self,
    x_BLD: Array,
    input_mask_BL: Array,
    deterministic: bool,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    last_positions_BQ: Array | None = None,
  ):
    """(last hidden state, hidden states, attentions). `last_positions_BQ` (unrolled layers,
    or scanned with `unroll_last_layer`): the last layer's outputs only at those positions
    ([B, Q, D]; see `BertConfig.prune_last_layer`)."""
    cfg = self.cfg
    if last_positions_BQ is not None and cfg.scan_layers and not cfg.unroll_last_layer:
      raise ValueError(
        "output positions (a pruned last layer) need unrolled layers: scan_layers=False, or "
        "unroll_last_layer=True"
      )
    dropping = not deterministic and cfg.attention_dropout_prob > 0
    # Once per trace of the model: every layer makes the same choice.
    logging.info(backends.attention_line(cfg, x_BLD.shape[1], dropping, output_attentions))
    mask_B1LS = attention_mask(input_mask_BL, cfg.causal)
    hidden, attentions = [x_BLD], []
    if cfg.scan_layers and last_positions_BQ is not None:
      mask_B1QS = attention_mask(input_mask_BL, cfg.causal, last_positions_BQ)
      x_BLD = _scan_then_last(self.is_initializing())(cfg, deterministic, name="layers")(
        x_BLD, mask_B1LS, mask_B1QS, last_positions_BQ, input_mask_BL
      )
    elif cfg.scan_layers:
      x_BLD, (h_NBLD, p_NBHLS) = _scan(cfg.num_layers)(
        cfg, deterministic, output_hidden_states, output_attentions, name="layers"
      )(x_BLD, mask_B1LS, input_mask_BL)
      if output_hidden_states:
        hidden += list(h_NBLD)
      if output_attentions:
        attentions = list(p_NBHLS)
    else:
      layer_cls = _maybe_remat(Layer, cfg, prevent_cse=True)
      for i in range(cfg.num_layers):
        positions_BQ, mask_B1QS = None, mask_B1LS
        if i == cfg.num_layers - 1 and last_positions_BQ is not None:
          positions_BQ = last_positions_BQ
          mask_B1QS = attention_mask(input_mask_BL, cfg.causal, positions_BQ)
        x_BLD, probs_BHQS = layer_cls(cfg, deterministic, output_attentions, name=f"layer_{i}")(
          x_BLD, mask_B1QS, positions_BQ, input_mask_BL
        )
        hidden.append(x_BLD)
        attentions.append(probs_BHQS)
    return (
      x_BLD,
      tuple(hidden) if output_hidden_states else None,
      tuple(attentions) if output_attentions else None,
    )


class BertModel(nn.Module):
  """Embeddings -> encoder -> tanh pooler. Returns a dict of outputs."""

  cfg: BertConfig

  def setup(self):
    self.embeddings = Embeddings(self.cfg)
    self.encoder = Encoder(self.cfg)
    self.pooler = Dense((self.cfg.hidden_size,), (sh.EMBED, sh.EMBED_OUT), self.cfg)

  def __call__(
    self,
    input_ids_BL: Array,
    segment_ids_BL: Array | None = None,
    input_mask_BL: Array | None = None,
    *,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    output_positions_BQ: Array | None = None,
  ) -> dict[str, Any]:
    """`output_positions_BQ` (position 0 first; `BertConfig.last_layer_prunable`): compute
    the last layer only at those positions; `sequence_output` is then [B, Q, D] at them and
    the pooler reads its first row (see `BertConfig.prune_last_layer`)."""
    if segment_ids_BL is None:
      segment_ids_BL = jnp.zeros_like(input_ids_BL)
    if input_mask_BL is None:
      input_mask_BL = jnp.ones_like(input_ids_BL)
    x_BLD = self.embeddings(input_ids_BL, segment_ids_BL, deterministic)
    x_BQD, hidden, attentions = self.encoder(
      x_BLD,
      input_mask_BL,
      deterministic,
      output_hidden_states,
      output_attentions,
      output_positions_BQ,
    )
    pooled_BD = jnp.tanh(self.pooler(x_BQD[:, 0]))
    out = {"sequence_output": x_BQD, "pooled_output": pooled_BD}
    if output_hidden_states:
      out["hidden_states"] = hidden
    if output_attentions:
      out["attentions"] = attentions
    return out


# ----------------------------------------------------------------------------- heads


class MLMHead(nn.Module):
  """transform (dense + GELU + LayerNorm) then the tied decoder plus an output bias."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, h_BPD: Array, embeddings: Embeddings) -> Array:
    cfg = self.cfg
    h_BPD = Dense((cfg.hidden_size,), (sh.EMBED, sh.EMBED_OUT), cfg, name="transform")(h_BPD)
    h_BPD = layer_norm(cfg, "transform_LayerNorm")(gelu(h_BPD))
    bias_V = self.param("bias", _zeros((sh.VOCAB,)), (cfg.vocab_size,), cfg.storage_dtype)
    logits_BPV = backends.ops_for(cfg).add_bias(embeddings.attend(h_BPD), bias_V)
    return _constrain(logits_BPV, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_VOCAB))


def nsp_head(cfg: BertConfig) -> Dense:
  """The 2-way next-sentence head on the pooled output, in float32 whatever the compute
  dtype (free at 2 outputs)."""
  return Dense((2,), (sh.EMBED, None), dataclasses.replace(cfg, dtype="float32"))


# ----------------------------------------------------------------------------- pretraining


class BertForPreTraining(nn.Module):
  """BertModel + MLM head (at `masked_positions`, or every position if None) + NSP head.

  With masked positions and `cfg.last_layer_prunable` (no hidden states or attentions asked
  for), the last layer runs only where the heads read, and the outputs have no
  `sequence_output`.

  For the left-to-right objective pass every position (or None); the same tied head then
  predicts the next token.
  """

  cfg: BertConfig

  def setup(self):
    self.bert = BertModel(self.cfg)
    self.predictions = MLMHead(self.cfg)
    self.seq_relationship = nsp_head(self.cfg)

  def __call__(
    self,
    input_ids_BL: Array,
    segment_ids_BL: Array | None = None,
    input_mask_BL: Array | None = None,
    masked_positions_BP: Array | None = None,
    *,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
  ) -> dict[str, Any]:
    cfg = self.cfg
    prune = (
      masked_positions_BP is not None
      and cfg.last_layer_prunable
      and not output_hidden_states
      and not output_attentions
    )
    out = self.bert(
      input_ids_BL,
      segment_ids_BL,
      input_mask_BL,
      deterministic=deterministic,
      output_hidden_states=output_hidden_states,
      output_attentions=output_attentions,
      # [CLS] (for the pooler) then the masked positions: Q = 1 + P.
      output_positions_BQ=(
        jnp.pad(masked_positions_BP.astype(jnp.int32), ((0, 0), (1, 0))) if prune else None
      ),
    )
    if prune:  # the last layer ran at [CLS] + the masked positions only
      h_BPD = out.pop("sequence_output")[:, 1:]
    elif masked_positions_BP is None:
      h_BPD = out["sequence_output"]
    else:
      h_BPD = gather_positions(out["sequence_output"], masked_positions_BP)
    out["mlm_logits"] = self.predictions(h_BPD, self.bert.embeddings)
    out["nsp_logits"] = self.seq_relationship(out["pooled_output"]).astype(jnp.float32)
    return out


# ----------------------------------------------------------------------------- init, counts, FLOPs


def dummy_inputs(batch: int = 1, length: int = 8) -> tuple[Array, Array, Array]:
  ids = jnp.zeros((batch, length), jnp.int32)
  return ids, ids, jnp.ones_like(ids)


def init_params(model: nn.Module, rng: Array, length: int = 8) -> Any:
  """Boxed params (LogicallyPartitioned leaves); unbox with nn.meta.unbox."""
  return model.init({"params": rng}, *dummy_inputs(1, length))["params"]


def count_params(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(nn.meta.unbox(params)))


@functools.cache
def abstract_params(cfg: BertConfig, pretraining: bool = True) -> Any:
  """Unboxed ShapeDtypeStructs of the params, without any compute."""
  model = BertForPreTraining(cfg) if pretraining else BertModel(cfg)
  boxed = jax.eval_shape(lambda r: init_params(model, r), jax.random.key(0))
  return nn.meta.unbox(boxed)


def train_flops_per_token(cfg: BertConfig, seq_len: int, predictions_per_seq: int) -> float:
  """Model FLOPs per token of one training step (3x the forward matmul FLOPs).

  Encoder matmuls, attention scores and values (the full L x L is computed even when causal),
  the MLM head at the positions actually computed (`predictions_per_seq`; = seq_len for LTR or
  an all-position head) and the pooler + NSP head (once per sequence). With a pruned last
  layer (`BertConfig.last_layer_prunable`, masked positions) that layer counts at the 1 +
  predictions_per_seq positions it computes, its key and value projections at every position.
  """
  n, d, f, v = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  per_layer = 6 * (4 * d * d + 2 * d * f) + 12 * d * seq_len
  encoder = n * per_layer
  if cfg.last_layer_prunable and predictions_per_seq < seq_len:
    q = (1 + predictions_per_seq) / seq_len  # share of positions the last layer computes
    last = 6 * 2 * d * d + q * (6 * (2 * d * d + 2 * d * f) + 12 * d * seq_len)
    encoder += last - per_layer
  head = 6 * (d * d + d * v) * predictions_per_seq / seq_len
  pooler_nsp = 6 * (d * d + 2 * d) / seq_len
  return float(encoder + head + pooler_nsp)
