"""BERT (Devlin et al. 2019) in Flax linen, faithful to the released models and sharded by
logical axes.

Post-LN Transformer encoder, exact-erf GELU, LayerNorm eps 1e-12, truncated-normal init
(std 0.02), learned positions, 2 token types, tanh pooler, MLM head (dense + GELU + LayerNorm,
decoder tied to the word embeddings plus an output bias) evaluated only at the gathered masked
positions, and a 2-way NSP head. Parameter names map 1:1 onto HuggingFace's
`BertForPreTraining` (see convert.py).

The layers are written in stock Flax/XLA ops. `BertConfig.kernels='cpu'` swaps in the XLA:CPU
speed kernels of kernels.py (same values and gradients, same parameters), through `ops_for`
only; 'auto' picks them on the CPU backend alone. `dropout_rng` picks how dropout masks are
drawn and `attention_impl` how self-attention is computed; their 'auto' values come from
measurements per backend (`resolve_kernels`, `DROPOUT_RNG_AUTO`, `AUTO_ATTENTION`).

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
import re
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import kernels
from bert_jax import sharding as sh

Array = jax.Array

# ----------------------------------------------------------------------------- config

KERNELS = ("auto", "xla", "cpu")
DROPOUT_RNGS = ("auto", "threefry", "rbg", "hash")
ATTENTION_IMPLS = ("auto", "explicit", "explicit_lowp", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Every hyper-parameter of the network; the keys of `config.model` in configs/."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_prob: float = 0.1
  attention_dropout_prob: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  # Left-to-right (causal) self-attention, for the paper's LTR ablation.
  causal: bool = False
  # Compute dtype; params are stored in param_dtype. Softmax, LayerNorm statistics, logits
  # and losses are always float32.
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = False  # nn.scan over layers: compile time independent of depth
  remat_policy: str = "none"  # none | full | dots | dots_no_batch | minimal
  # Pretraining with masked positions (unrolled layers): the last layer computes its queries,
  # attention output and FFN only at [CLS] and the masked positions, the only outputs the
  # MLM and NSP heads read (keys and values still cover every position). Same losses and
  # gradients, ~(1 - (P+1)/L) of one layer's FLOPs fewer.
  prune_last_layer: bool = True
  # Which ops the layers run: 'xla' stock Flax/XLA ops, 'cpu' the XLA:CPU kernels of
  # kernels.py (same values and parameters), 'auto' = 'cpu' on the CPU backend, else 'xla'
  # (see `resolve_kernels`).
  kernels: str = "auto"
  # How dropout keep-masks are drawn from the 'dropout' rng (same keep probability, other
  # masks): 'threefry' jax.random's default generator (flax's nn.Dropout), 'rbg' XLA's
  # RngBitGenerator seeded from the threefry key, 'hash' a counter hash of each element's
  # index (kernels.py); 'auto' per backend, `DROPOUT_RNG_AUTO`. MLM masking never uses it.
  dropout_rng: str = "auto"
  # Self-attention: 'explicit' softmax with float32 probabilities materialised; 'explicit_lowp'
  # the same with the probabilities kept in the compute dtype from float32 statistics
  # (kernels.attention_probs; equal to 'explicit' in float32); 'xla' / 'cudnn'
  # jax.nn.dot_product_attention with that implementation (no attention dropout; cudnn: on a
  # GPU, bf16 or fp16, float32 falls back to 'xla'); 'auto' per backend and length,
  # `AUTO_ATTENTION`. Attention probabilities asked for (output_attentions) come from 'explicit'.
  attention_impl: str = "auto"
  # The JAX platform `resolve_kernels` resolved the 'auto' fields for ('' = not resolved: the
  # process's default backend when traced). Set by resolve_kernels, not by configs.
  platform: str = ""

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(
        f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
      )
    if self.kernels not in KERNELS:
      raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {self.kernels!r}")
    if self.attention_impl == "fused":  # its name in checkpoints of earlier versions
      object.__setattr__(self, "attention_impl", "auto")
    if self.dropout_rng not in DROPOUT_RNGS:
      raise ValueError(
        f"dropout_rng must be one of {', '.join(DROPOUT_RNGS)}, not {self.dropout_rng!r}"
      )
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f"attention_impl must be one of {', '.join(ATTENTION_IMPLS)}, not {self.attention_impl!r}"
      )
    if self.attention_impl in ("xla", "cudnn") and self.attention_dropout_prob > 0:
      raise ValueError(
        f"attention_impl={self.attention_impl!r} has no attention dropout: set "
        f"attention_dropout_prob=0 (it is {self.attention_dropout_prob}) or attention_impl to "
        "auto, explicit or explicit_lowp"
      )
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"remat_policy {self.remat_policy!r} not in {sorted(REMAT_POLICIES)}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in ("float32", "bfloat16", "float16"):
        raise ValueError(
          f"{name} must be float32, bfloat16 or float16, not {getattr(self, name)!r}"
        )

  @property
  def last_layer_prunable(self) -> bool:
    """Whether pretraining with masked positions runs the last layer only where the heads
    read (`prune_last_layer`; scanned layers share one layer body, so they never prune)."""
    return self.prune_last_layer and not self.scan_layers

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def storage_dtype(self):
    return jnp.dtype(self.param_dtype)


REMAT_POLICIES = {
  "none": None,
  "full": jax.checkpoint_policies.nothing_saveable,
  "dots": jax.checkpoint_policies.checkpoint_dots,
  "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
  "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# dropout_rng='auto' per platform, each from a measurement on that platform:
# - cpu: 'hash'. tools/probes/lockstep_ab.py --size=tiny --layers=0 --rounds=12 --turn_s=3 (bf16,
#   seq 128, batch 32), step time over hash's: rbg 1.125, threefry 1.047 (medians).
# - tpu: 'hash'. bert_jax.aot, BERT-Base (scanned layers) bf16, 256 x 128 on v5e-16, mesh
#   (1,16,1): temporaries per device threefry 1.81, hash 1.81, rbg 1.92 GiB (XLA's
#   RngBitGenerator partitioning makes every device generate the global batch's mask);
#   XLA-counted FLOPs threefry 7.41e10, hash 7.23e10 (rbg 7.18e10: its bits count as none).
# - gpu: 'threefry', the generator before dropout_rng existed: nothing measured on a GPU yet;
#   the prepared GPU command times dropout_rng=threefry|rbg|hash and its numbers decide.
DROPOUT_RNG_AUTO = {"cpu": "hash", "tpu": "hash", "gpu": "threefry"}

# attention_impl='auto' per (platform, key length S): (the implementation without attention
# dropout, the one with it). Only measured entries (another length takes the nearest measured
# one); a platform without any entry keeps the behaviour before attention_impl existed: 'xla'
# without attention dropout, 'explicit' with it.
# - tpu: bert_jax.aot, BERT-Base (scanned layers) bf16 on v5e-16, mesh (1,16,1), dropout_rng
#   hash; temporaries per device (XLA-counted FLOPs within 0.6% of each other):
#     S=128, batch 256: with attention dropout explicit 1.81, explicit_lowp 1.74 GiB; without
#       xla 1.78, explicit 1.78, explicit_lowp 1.67 GiB.
#     S=512, batch 64: with explicit 2.58, explicit_lowp 2.30 GiB; without xla 2.44,
#       explicit_lowp 1.87 GiB.
# - cpu: tools/probes/lockstep_ab.py, bf16, step time of B over A (medians of 12-16 rounds):
#     without attention dropout, explicit_lowp over xla: BERT-tiny S=128 batch 32 0.935,
#       S=512 batch 8 0.882; 4-layer Base S=128 0.860; over explicit: tiny S=512 0.948.
#       (float32, where explicit_lowp is explicit: over xla, tiny S=128 1.004.)
#     with attention dropout, explicit_lowp over explicit: tiny S=128 0.991, S=512 1.006 (no
#       gain: 'explicit' stays).
# - gpu: no entry yet. The prepared GPU command times attention_impl=explicit|explicit_lowp
#   (attention dropout 0.1) and xla|cudnn|explicit_lowp (attention_dropout_prob=0) at seq 128
#   and 512; its numbers fill the ("gpu", S) entries.
AUTO_ATTENTION: dict[tuple[str, int], tuple[str, str]] = {
  ("cpu", 128): ("explicit_lowp", "explicit"),
  ("cpu", 512): ("explicit_lowp", "explicit"),
  ("tpu", 128): ("explicit_lowp", "explicit_lowp"),
  ("tpu", 512): ("explicit_lowp", "explicit_lowp"),
}
DEFAULT_ATTENTION = ("xla", "explicit")


def platform_family(platform: str) -> str:
  """A JAX platform name as DROPOUT_RNG_AUTO and AUTO_ATTENTION key it ('cuda', 'rocm' -> 'gpu')."""
  return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


def resolve_kernels(cfg: BertConfig, platform: str) -> BertConfig:
  """`cfg` resolved for a JAX platform ('cpu', 'tpu', 'gpu', 'cuda', ...): `kernels` 'auto'
  becomes 'cpu' on the CPU platform and 'xla' on every other, `dropout_rng` 'auto' the
  platform's `DROPOUT_RNG_AUTO`, and `platform` records it for `attention_impl` 'auto' (which
  also depends on the sequence length: `attention_choice`). Explicit values stay."""
  family = platform_family(platform)
  return dataclasses.replace(
    cfg,
    kernels=cfg.kernels if cfg.kernels != "auto" else "cpu" if family == "cpu" else "xla",
    dropout_rng=(
      cfg.dropout_rng if cfg.dropout_rng != "auto" else DROPOUT_RNG_AUTO.get(family, "threefry")
    ),
    platform=family,
  )


def resolved(cfg: BertConfig) -> BertConfig:
  """`cfg` as resolved for its platform, or for the process's default backend if it was never
  resolved."""
  if cfg.platform and "auto" not in (cfg.kernels, cfg.dropout_rng):
    return cfg
  return resolve_kernels(cfg, cfg.platform or jax.default_backend())


def attention_choice(cfg: BertConfig, key_length: int, dropout: bool, probs: bool) -> str:
  """The attention implementation a layer runs: `cfg.attention_impl`, or for 'auto' the
  measured `AUTO_ATTENTION` entry of cfg's platform nearest to `key_length` (by whether
  attention dropout is active). Probabilities asked for always take 'explicit'."""
  if probs:
    return "explicit"
  if cfg.attention_impl != "auto":
    return cfg.attention_impl
  platform = resolved(cfg).platform
  lengths = [s for p, s in AUTO_ATTENTION if p == platform]
  if lengths:
    nearest = min(lengths, key=lambda s: (abs(s - key_length), s))
    choice = AUTO_ATTENTION[(platform, nearest)]
  else:
    choice = DEFAULT_ATTENTION
  return choice[1] if dropout else choice[0]


# ----------------------------------------------------------------------------- sizes

# (num_layers, hidden_size, num_heads); intermediate = 4 * hidden.
SIZES = {
  "tiny": (2, 128, 2),
  "mini": (4, 256, 4),
  "small": (4, 512, 8),
  "medium": (8, 512, 8),
  "base": (12, 768, 12),
  "large": (24, 1024, 16),
  # The paper's Table 6 (ablation over model size).
  "L3_H768_A12": (3, 768, 12),
  "L6_H768_A3": (6, 768, 3),
  "L6_H768_A12": (6, 768, 12),
  "L12_H768_A12": (12, 768, 12),
  "L12_H1024_A16": (12, 1024, 16),
  "L24_H1024_A16": (24, 1024, 16),
}


def size_fields(name: str) -> dict[str, int]:
  """BertConfig fields for a named size ('tiny' ... 'large', a Table 6 row, or any size named
  as the paper names them, 'L{layers}_H{hidden}_A{heads}')."""
  m = re.fullmatch(r"L(\d+)_H(\d+)_A(\d+)", name)
  if name in SIZES:
    n, d, h = SIZES[name]
  elif m and int(m[2]) % int(m[3]) == 0 and min(map(int, m.groups())) > 0:
    n, d, h = map(int, m.groups())
  else:
    raise ValueError(
      f"unknown model size {name!r}; choose from {', '.join(SIZES)} or L<layers>_H<hidden>_A<heads>"
      " (hidden a multiple of heads)"
    )
  return dict(num_layers=n, hidden_size=d, num_heads=h, intermediate_size=4 * d)


def config_for_size(name: str, **overrides: Any) -> BertConfig:
  return BertConfig(**{**size_fields(name), **overrides})


# ----------------------------------------------------------------------------- ops


@dataclasses.dataclass(frozen=True)
class Ops:
  """The array ops the layers are written in: one set per resolved `BertConfig.kernels`."""

  matmul: Callable[..., Array]  # (x, w, contract, dtype): x[..., *c] @ w[*c, ...] in dtype
  add_bias: Callable[[Array, Array], Array]  # (y, b): y + b in y's dtype
  logits: Callable[..., Array]  # (h, table_VD, dtype): float32 h . table^T
  scores: Callable[[Array, Array], Array]  # (q_BQHK, k_BSHK): float32 [B, H, Q, S]
  context: Callable[[Array, Array], Array]  # (p_BHQS, v_BSHK): float32 [B, Q, H, K]
  layer_norm: Callable[..., nn.Module]  # nn.LayerNorm's fields and parameters


def _f32_einsum(spec: str, a: Array, b: Array) -> Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


XLA_OPS = Ops(
  matmul=lambda x, w, contract, dtype: jnp.tensordot(x.astype(dtype), w.astype(dtype), contract),
  add_bias=lambda y, b: y + b.astype(y.dtype),
  logits=lambda h, table_VD, dtype: _f32_einsum(
    "...d,vd->...v", h.astype(dtype), table_VD.astype(dtype)
  ),
  scores=functools.partial(_f32_einsum, "bqhk,bshk->bhqs"),
  context=functools.partial(_f32_einsum, "bhqs,bshk->bqhk"),
  layer_norm=functools.partial(nn.LayerNorm, use_fast_variance=False),
)

CPU_OPS = Ops(
  matmul=kernels.matmul,
  add_bias=kernels.add_bias,
  logits=kernels.tied_logits,
  scores=kernels.attention_scores,
  context=kernels.attention_context,
  layer_norm=kernels.LayerNorm,
)


def ops_for(cfg: BertConfig) -> Ops:
  """The one place `BertConfig.kernels` acts (an unresolved 'auto' resolves for the default
  backend of the process)."""
  return CPU_OPS if resolved(cfg).kernels == "cpu" else XLA_OPS


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
    ops = ops_for(cfg)
    return ops.add_bias(ops.matmul(x, kernel, self.contract, cfg.compute_dtype), bias)


def layer_norm(cfg: BertConfig, name: str) -> nn.Module:
  """LayerNorm over the hidden axis (statistics in float32), params `scale` and `bias`."""
  return ops_for(cfg).layer_norm(
    epsilon=cfg.layer_norm_eps,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.storage_dtype,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (sh.EMBED,)),
    bias_init=_zeros((sh.EMBED,)),
    name=name,
  )


# dropout_rng -> (key, shape, rate) -> boolean keep-mask, True with probability 1 - rate.
KEEP_MASKS: dict[str, Callable[[Array, tuple[int, ...], float], Array]] = {
  "threefry": lambda key, shape, rate: jax.random.bernoulli(key, 1.0 - rate, shape),
  "rbg": kernels.rbg_keep_mask,
  "hash": kernels.keep_mask,
}


class Dropout(nn.Module):
  """Inverted dropout with the 'dropout' rng collection, as flax's nn.Dropout (with 'threefry'
  the same masks and values), keep-masks drawn by `KEEP_MASKS[rng]`."""

  rate: float
  rng_impl: str = "threefry"  # a resolved BertConfig.dropout_rng

  def keep_mask(self, shape: tuple[int, ...]) -> Array:
    return KEEP_MASKS[self.rng_impl](self.make_rng("dropout"), shape, self.rate)

  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    keep = self.keep_mask(x.shape)
    return jax.lax.select(keep, x / (1.0 - self.rate), jnp.zeros_like(x))


def dropout(cfg: BertConfig, rate: float) -> Dropout:
  return Dropout(rate, resolved(cfg).dropout_rng)


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
    """Logits against the word embeddings (the tied MLM decoder), in float32."""
    table_VD = self.word_embeddings.embedding
    return ops_for(self.cfg).logits(h_BPD, table_VD, self.cfg.compute_dtype)


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
  ops: Ops,
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


def self_attention(
  cfg: BertConfig,
  xq_BQD: Array,
  x_BSD: Array,
  mask_B1QS: Array,
  deterministic: bool,
  output_attentions: bool,
) -> tuple[Array, Array | None]:
  """Multi-head self-attention with queries from `xq_BQD`, keys and values from `x_BSD`,
  then the output projection: ([B, Q, D], the probabilities when asked for, else None).
  The implementation is `attention_choice`'s.

  Called inside `Layer`, whose params (`query`, `key`, `value`, `attention_output`) these are.
  """
  h, k = cfg.num_heads, cfg.head_dim
  qkv_axes = (sh.EMBED, sh.HEADS, sh.KV)
  act = (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_HEADS, sh.ACT_KV)
  q_BQHK = _constrain(Dense((h, k), qkv_axes, cfg, name="query")(xq_BQD), act)
  k_BSHK = _constrain(Dense((h, k), qkv_axes, cfg, name="key")(x_BSD), act)
  v_BSHK = _constrain(Dense((h, k), qkv_axes, cfg, name="value")(x_BSD), act)

  dropping = not deterministic and cfg.attention_dropout_prob > 0
  impl = attention_choice(cfg, x_BSD.shape[1], dropping, output_attentions)
  if impl == "cudnn" and q_BQHK.dtype == jnp.float32:
    impl = "xla"  # cuDNN's fused attention has no float32 kernels
  probs_BHQS = None
  if impl in ("explicit", "explicit_lowp"):
    drop = dropout(cfg, cfg.attention_dropout_prob) if dropping else None
    ctx_BQHK, probs_BHQS = explicit_attention(
      q_BQHK, k_BSHK, v_BSHK, mask_B1QS, ops_for(cfg), drop, lowp=impl == "explicit_lowp"
    )
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
    self, x_BLD: Array, mask_B1QS: Array, positions_BQ: Array | None = None
  ) -> tuple[Array, Array | None]:
    """[B, L, D] -> [B, Q, D]: with `positions_BQ` only those positions' outputs (the queries,
    attention output and FFN run at the Q gathered positions, keys and values at all L),
    else Q = L."""
    cfg = self.cfg
    xq_BQD = x_BLD if positions_BQ is None else gather_positions(x_BLD, positions_BQ)
    attn_BQD, probs_BHQS = self_attention(
      cfg, xq_BQD, x_BLD, mask_B1QS, self.deterministic, self.output_attentions
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
  def __call__(self, x_BLD: Array, mask_B1LS: Array):
    layer_cls = _maybe_remat(Layer, self.cfg, prevent_cse=False)
    x_BLD, probs_BHLS = layer_cls(
      self.cfg, self.deterministic, self.output_attentions, name="layer"
    )(x_BLD, mask_B1LS)
    return x_BLD, (x_BLD if self.output_hidden_states else None, probs_BHLS)


def _maybe_remat(cls, cfg: BertConfig, prevent_cse: bool):
  if cfg.remat_policy == "none":
    return cls
  return nn.remat(cls, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=prevent_cse)


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
    """(last hidden state, hidden states, attentions). `last_positions_BQ` (unrolled layers
    only): the last layer's outputs only at those positions ([B, Q, D]; see
    `BertConfig.prune_last_layer`)."""
    cfg = self.cfg
    if last_positions_BQ is not None and cfg.scan_layers:
      raise ValueError(
        "output positions (a pruned last layer) need unrolled layers: scan_layers=False"
      )
    mask_B1LS = attention_mask(input_mask_BL, cfg.causal)
    hidden, attentions = [x_BLD], []
    if cfg.scan_layers:
      scanned = nn.scan(
        _ScanLayer,
        variable_axes={"params": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,),
        length=cfg.num_layers,
        metadata_params={nn.PARTITION_NAME: sh.LAYERS},
      )
      x_BLD, (h_NBLD, p_NBHLS) = scanned(
        cfg, deterministic, output_hidden_states, output_attentions, name="layers"
      )(x_BLD, mask_B1LS)
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
          x_BLD, mask_B1QS, positions_BQ
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
    """`output_positions_BQ` (position 0 first, unrolled layers): compute the last layer only
    at those positions; `sequence_output` is then [B, Q, D] at them and the pooler reads
    its first row (see `BertConfig.prune_last_layer`)."""
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
    logits_BPV = ops_for(cfg).add_bias(embeddings.attend(h_BPD), bias_V)
    return _constrain(logits_BPV, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_VOCAB))


def nsp_head(cfg: BertConfig) -> Dense:
  """The 2-way next-sentence head on the pooled output, in float32 whatever the compute
  dtype (free at 2 outputs)."""
  return Dense((2,), (sh.EMBED, None), dataclasses.replace(cfg, dtype="float32"))


# ----------------------------------------------------------------------------- pretraining


class BertForPreTraining(nn.Module):
  """BertModel + MLM head (at `masked_positions`, or every position if None) + NSP head.

  With masked positions and `cfg.prune_last_layer` (unrolled layers, no hidden states or
  attentions asked for), the last layer runs only where the heads read, and the outputs
  have no `sequence_output`.

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
  layer (`BertConfig.prune_last_layer`, masked positions, unrolled layers) that layer counts
  at the 1 + predictions_per_seq positions it computes, its key and value projections at
  every position.
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
