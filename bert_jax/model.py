"""BERT (Devlin et al. 2019) in Flax linen, faithful to the released models and sharded by
logical axes.

Post-LN Transformer encoder, exact-erf GELU, LayerNorm eps 1e-12, truncated-normal init
(std 0.02), learned positions, 2 token types, tanh pooler, MLM head (dense + GELU + LayerNorm,
decoder tied to the word embeddings plus an output bias) evaluated only at the gathered masked
positions, and a 2-way NSP head. Parameter names map 1:1 onto HuggingFace's
`BertForPreTraining` (see convert.py).

Shape key: B batch, L sequence length, D hidden, H heads, K head dim, F intermediate (FFN),
V vocab, P predicted positions, N layers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import sharding as sh

Array = jax.Array


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
  # 'fused' uses jax.nn.dot_product_attention whenever attention dropout is inactive
  # (eval, or attention_dropout_prob == 0); 'explicit' always materialises the probabilities.
  attention_impl: str = "fused"
  scan_layers: bool = False  # nn.scan over layers: compile time independent of depth
  remat_policy: str = "none"  # none | full | dots | dots_no_batch | minimal
  # Dropout masks: 'hash' (a counter hash seeded from the dropout key, ~7x cheaper than
  # threefry on CPU) or 'threefry' (jax.random.bernoulli, as flax's nn.Dropout).
  dropout_rng: str = "hash"
  # Query/key/value as one matmul over the concatenated kernels (params stay separate); off:
  # measured no faster on XLA:CPU (see the benchmark section of the README).
  fuse_qkv: bool = False
  # Pretraining with masked positions (unrolled layers): the last layer computes its queries,
  # attention output and FFN only at [CLS] and the masked positions, the only outputs the
  # MLM and NSP heads read (keys and values still cover every position). Same losses and
  # gradients, ~(1 - (P+1)/L) of one layer's FLOPs fewer.
  prune_last_layer: bool = True
  # float32 matmuls through the custom VJP that bf16 always uses: on CPU its weight gradient
  # copies the narrower operand into a transposed layout, so every dot runs on YNNPACK
  # (see `_dw_cpu`). False: plain autodiff (the reference; a BERT-Base step 4-7% slower on
  # XLA:CPU, README).
  matmul_vjp: bool = True

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(
        f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
      )
    if self.attention_impl not in ("fused", "explicit"):
      raise ValueError(f"attention_impl must be 'fused' or 'explicit', not {self.attention_impl!r}")
    if self.dropout_rng not in ("hash", "threefry"):
      raise ValueError(f"dropout_rng must be 'hash' or 'threefry', not {self.dropout_rng!r}")
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
  """BertConfig fields for a named size ('tiny' ... 'large', or a Table 6 row)."""
  if name not in SIZES:
    raise ValueError(f"unknown model size {name!r}; choose from {', '.join(SIZES)}")
  n, d, h = SIZES[name]
  return dict(num_layers=n, hidden_size=d, num_heads=h, intermediate_size=4 * d)


def config_for_size(name: str, **overrides: Any) -> BertConfig:
  return BertConfig(**{**size_fields(name), **overrides})


def gelu(x: Array) -> Array:
  """BERT's exact (erf) GELU, not the tanh approximation."""
  return jax.nn.gelu(x, approximate=False)


def _init(cfg: BertConfig, names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
    nn.initializers.truncated_normal(stddev=cfg.initializer_range), names
  )


def _zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _dims(x_ndim: int, contract: int):
  return ((tuple(range(x_ndim - contract, x_ndim)), tuple(range(contract))), ((), ()))


def matmul(x: Array, w: Array, contract: int, dtype, vjp: bool = True) -> Array:
  """x[..., *c] @ w[*c, ...] in `dtype`, accumulated in float32.

  The single place that decides matmul precision. bf16 (or fp16): operands in `dtype` with
  a float32 accumulator (`preferred_element_type`, ~2x the fp32 rate on XLA:CPU, what TPU
  MXUs do). A custom VJP keeps both backward dots in `dtype` with float32 accumulators:
  dX = g . W^T (autodiff would emit a slow bf16 -> bf16 dot) and dW = X^T . g, on CPU from a
  transposed copy of the narrower of X and g (see `_dw_cpu`). float32 uses the same VJP
  (the same dots as autodiff, but autodiff's dW on XLA:CPU transposes the wider operand or
  falls back from YNNPACK to a slower Eigen dot: a 4-layer BERT-Base step 4-7% faster);
  `vjp=False` gives float32 plain autodiff instead.
  """
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32 and not vjp:
    return jax.lax.dot_general(x.astype(dtype), w.astype(dtype), _dims(x.ndim, contract))
  return _matmul(x, w, contract, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x: Array, w: Array, contract: int, dtype) -> Array:
  y = jax.lax.dot_general(
    x.astype(dtype), w.astype(dtype), _dims(x.ndim, contract), preferred_element_type=jnp.float32
  )
  return y.astype(dtype)


def _matmul_fwd(x, w, contract, dtype):
  xc, wc = x.astype(dtype), w.astype(dtype)
  # Zero-size arrays carry the input dtypes (residuals must be arrays).
  dtypes = (jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))
  return _matmul(xc, wc, contract, dtype), (xc, wc, dtypes)


def _matmul_bwd(contract, dtype, res, g):
  xc, wc, (x_like, w_like) = res
  n_out = wc.ndim - contract
  n_batch = xc.ndim - contract
  g_out = tuple(range(g.ndim - n_out, g.ndim))
  gc = g.astype(dtype)
  dx = jax.lax.dot_general(
    gc, wc, ((g_out, tuple(range(contract, wc.ndim))), ((), ())), preferred_element_type=jnp.float32
  )
  dw = jax.lax.platform_dependent(
    xc, gc, cpu=functools.partial(_dw_cpu, n_batch), default=functools.partial(_dw, n_batch)
  )
  return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


def _dw(n_batch: int, x: Array, g: Array) -> Array:
  """dW = X^T . g: contraction over the leading (token) dims, float32 accumulator."""
  batch = tuple(range(n_batch))
  return jax.lax.dot_general(x, g, ((batch, batch), ((), ())), preferred_element_type=jnp.float32)


def _physical_t(a_MN: Array) -> Array:
  """a.T as a copy XLA keeps: a plain `.T` is folded back into the neighbouring dot (as a
  transposed operand or output layout); the size-1 axis keeps the copy physical."""
  m, n = a_MN.shape
  return jnp.transpose(a_MN[:, :, None], (1, 0, 2)).reshape(n, m)


def _dw_cpu(n_batch: int, x: Array, g: Array) -> Array:
  """_dw for XLA:CPU, whose dots are fast only when the left operand is contracted on its
  minor dim: bf16 x[T, in] contracted on T runs at ~half speed (4096x768x3072: ~150 vs ~265
  GFLOP/s), and in float32 such a dot leaves YNNPACK for a slower Eigen kernel. So the
  narrower of X and g is transposed into a [features, T] copy first: dW = X'^T . g, or
  dW = (g'^T . X)^T for a wide X (the FFN output layer's 3072 inputs: a [768, T] copy and a
  9 MB transposed result instead of a 50 MB [3072, T] copy)."""
  tokens = math.prod(x.shape[:n_batch])
  x_TI, g_TO = x.reshape(tokens, -1), g.reshape(tokens, -1)
  nn_dims = (((1,), (0,)), ((), ()))
  if x_TI.shape[1] <= g_TO.shape[1]:
    dw = jax.lax.dot_general(_physical_t(x_TI), g_TO, nn_dims, preferred_element_type=jnp.float32)
  else:
    dw_t = jax.lax.dot_general(_physical_t(g_TO), x_TI, nn_dims, preferred_element_type=jnp.float32)
    dw = _physical_t(dw_t)
  return dw.reshape(x.shape[n_batch:] + g.shape[n_batch:])


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def tied_logits(h: Array, table_VD: Array, dtype) -> Array:
  """float32 logits h[..., D] . table[V, D]^T; see `_tied_logits` for low precision."""
  if jnp.dtype(dtype) == jnp.float32:
    dims = (((h.ndim - 1,), (1,)), ((), ()))
    return jax.lax.dot_general(h.astype(jnp.float32), table_VD.astype(jnp.float32), dims)
  return _tied_logits(h, table_VD, jnp.dtype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _tied_logits(h: Array, table_VD: Array, dtype) -> Array:
  """float32 logits h[..., D] . table[V, D]^T with `dtype` operands and a float32 accumulator.

  The custom VJP runs both backward dots with `dtype` operands as well (autodiff would run
  them in float32: the cotangent of float32 logits is float32), the table gradient from a
  transposed copy of the cotangent on CPU (see `_dw_cpu`)."""
  dims = (((h.ndim - 1,), (1,)), ((), ()))
  return jax.lax.dot_general(
    h.astype(dtype), table_VD.astype(dtype), dims, preferred_element_type=jnp.float32
  )


def _tied_fwd(h, table_VD, dtype):
  hc, tc = h.astype(dtype), table_VD.astype(dtype)
  dtypes = (jnp.zeros((0,), h.dtype), jnp.zeros((0,), table_VD.dtype))
  return _tied_logits(hc, tc, dtype), (hc, tc, dtypes)


def _tied_bwd(dtype, res, g):
  hc, tc, (h_like, t_like) = res
  gc = g.astype(dtype)
  dh = jax.lax.dot_general(
    gc, tc, (((g.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32
  )
  n_batch = g.ndim - 1
  dt = jax.lax.platform_dependent(
    gc, hc, cpu=functools.partial(_dw_cpu, n_batch), default=functools.partial(_dw, n_batch)
  )
  return dh.astype(h_like.dtype), dt.astype(t_like.dtype)


_tied_logits.defvjp(_tied_fwd, _tied_bwd)


def _f32_einsum(spec: str, a: Array, b: Array) -> Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def attention_scores(q_BLHK: Array, k_BLHK: Array) -> Array:
  """float32 [B, H, Lq, Lk] = q . k per head; low precision through `_scores` (custom VJP)."""
  if q_BLHK.dtype == jnp.float32 and k_BLHK.dtype == jnp.float32:
    return _f32_einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK)
  return _scores(q_BLHK, k_BLHK)


@jax.custom_vjp
def _scores(q_BLHK: Array, k_BLHK: Array) -> Array:
  """float32 [B, H, Lq, Lk] = q . k per head, operands in their own dtype.

  This and `_context` have VJPs that keep the backward dots in the operands' dtype
  (autodiff would run them on float32 cotangents, ~3x slower in bf16 on XLA:CPU) and in
  operand orders XLA:CPU supports for bf16 (bqhk,bhqs->bshk has no bf16 kernel there)."""
  return _f32_einsum("bqhk,bshk->bhqs", q_BLHK, k_BLHK)


def _scores_fwd(q, k):
  return _scores(q, k), (q, k)


def _scores_bwd(res, g_BHQS):
  q, k = res
  g = g_BHQS.astype(q.dtype)
  dq = _f32_einsum("bhqs,bshk->bqhk", g, k)
  dk = _f32_einsum("bhqs,bqhk->bshk", g, q)
  return dq.astype(q.dtype), dk.astype(k.dtype)


_scores.defvjp(_scores_fwd, _scores_bwd)


def attention_context(p_BHQS: Array, v_BLHK: Array) -> Array:
  """float32 [B, Lq, H, K] = p . v per head; low precision through `_context` (custom VJP)."""
  if p_BHQS.dtype == jnp.float32 and v_BLHK.dtype == jnp.float32:
    return _f32_einsum("bhqs,bshk->bqhk", p_BHQS, v_BLHK)
  return _context(p_BHQS, v_BLHK)


@jax.custom_vjp
def _context(p_BHQS: Array, v_BLHK: Array) -> Array:
  """See `_scores`."""
  return _f32_einsum("bhqs,bshk->bqhk", p_BHQS, v_BLHK)


def _context_fwd(p, v):
  return _context(p, v), (p, v)


def _context_bwd(res, g_BQHK):
  p, v = res
  g = g_BQHK.astype(v.dtype)
  dp = _f32_einsum("bqhk,bshk->bhqs", g, v)
  dv = _f32_einsum("bhqs,bqhk->bshk", p, g)
  return dp.astype(p.dtype), dv.astype(v.dtype)


_context.defvjp(_context_fwd, _context_bwd)


@jax.custom_vjp
def add_bias(y: Array, b: Array) -> Array:
  """y[..., *F] + b[*F] in y's dtype. The bias gradient is a float32 sum over the leading
  axes: autodiff would sum a bf16 y's cotangent with a bf16 accumulator (lossy over thousands
  of tokens, and ~20x slower on XLA:CPU than a float32 reduction)."""
  return y + b.astype(y.dtype)


def _add_bias_fwd(y, b):
  # A zero-size residual carries b's rank and dtype.
  return add_bias(y, b), jnp.zeros((0,) * b.ndim, b.dtype)


def _add_bias_bwd(b_like, g):
  lead = tuple(range(g.ndim - b_like.ndim))
  return g, jnp.sum(g, axis=lead, dtype=jnp.float32).astype(b_like.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


class Dense(nn.Module):
  """Dense layer with an N-d kernel `in_shape + features` and named logical axes."""

  features: tuple[int, ...]
  axes: tuple[str | None, ...]  # logical names of the kernel dims (inputs then outputs)
  cfg: BertConfig
  contract: int = 1
  compute: bool = True  # False: return (kernel, bias) for a fused matmul elsewhere

  @nn.compact
  def __call__(self, x: Array) -> Array | tuple[Array, Array]:
    in_shape = x.shape[x.ndim - self.contract :]
    kernel = self.param(
      "kernel", _init(self.cfg, self.axes), (*in_shape, *self.features), self.cfg.storage_dtype
    )
    bias = self.param(
      "bias", _zeros(self.axes[self.contract :]), self.features, self.cfg.storage_dtype
    )
    if not self.compute:
      return kernel, bias
    y = matmul(x, kernel, self.contract, self.cfg.compute_dtype, self.cfg.matmul_vjp)
    return add_bias(y, bias)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis with params `scale` and `bias` (nn.LayerNorm's names).

  Everything in float32 whatever the compute dtype; only the output is cast. So the scale and
  bias gradients are float32 sums over the tokens (nn.LayerNorm in bf16 sums them with a bf16
  accumulator, which is both lossy and ~20x slower on XLA:CPU).
  """

  epsilon: float
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = x.shape[-1]
    scale = self.param(
      "scale",
      nn.with_logical_partitioning(nn.initializers.ones_init(), (sh.EMBED,)),
      (features,),
      self.param_dtype,
    )
    bias = self.param("bias", _zeros((sh.EMBED,)), (features,), self.param_dtype)
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
    y = centered * jax.lax.rsqrt(var + self.epsilon)
    y = y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(self.dtype)


def layer_norm(cfg: BertConfig, name: str) -> LayerNorm:
  return LayerNorm(cfg.layer_norm_eps, cfg.compute_dtype, cfg.storage_dtype, name=name)


def _fmix32(h: Array) -> Array:
  """murmur3's 32-bit finaliser: a bijective avalanche hash."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def keep_mask(key: Array, shape: tuple[int, ...], rate: float, rng: str = "hash") -> Array:
  """Boolean dropout keep-mask, True with probability 1 - rate.

  'hash': two 32-bit words drawn from `key` seed a double murmur3 finaliser of each element's
  index (counter-based, like Philox in cuDNN dropout): element-wise and fused by XLA, where
  threefry costs ~25 ns per element on this CPU. The keep probability is exact to 2**-32.
  """
  if rng == "threefry":
    return jax.random.bernoulli(key, 1.0 - rate, shape)
  seed = jax.random.bits(key, (2,), jnp.uint32)
  idx = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  h = _fmix32(_fmix32(idx ^ seed[0]) + seed[1])
  return h >= jnp.uint32(min(round(rate * 2**32), 2**32 - 1))


class Dropout(nn.Module):
  """Inverted dropout with the `dropout` rng collection, as nn.Dropout, with a choice of RNG."""

  rate: float
  rng: str = "hash"

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    keep = keep_mask(self.make_rng("dropout"), x.shape, self.rate, self.rng)
    return jnp.where(keep, x / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros((), x.dtype))


def _constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


class Embeddings(nn.Module):
  """Word + learned position + token type embeddings, LayerNorm, dropout."""

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
    self.dropout = Dropout(cfg.hidden_dropout_prob, cfg.dropout_rng)

  def __call__(self, input_ids_BL: Array, segment_ids_BL: Array, deterministic: bool) -> Array:
    length = input_ids_BL.shape[1]
    if length > self.cfg.max_position_embeddings:
      raise ValueError(
        f"sequence length {length} exceeds max_position_embeddings "
        f"{self.cfg.max_position_embeddings}"
      )
    x_BLD = self.word_embeddings(input_ids_BL)
    x_BLD = x_BLD + self.position_embeddings(jnp.arange(length))[None]
    x_BLD = x_BLD + self.token_type_embeddings(segment_ids_BL)
    x_BLD = self.LayerNorm(x_BLD)
    x_BLD = self.dropout(x_BLD, deterministic=deterministic)
    return _constrain(x_BLD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

  def attend(self, h_BPD: Array) -> Array:
    """Logits against the word embeddings (the tied MLM decoder), in float32."""
    return tied_logits(h_BPD, self.word_embeddings.embedding, self.cfg.compute_dtype)


def attention_mask(input_mask_BL: Array, causal: bool) -> Array:
  """Boolean [B, 1, L, L] mask: query i may attend key j."""
  mask_B11L = input_mask_BL.astype(bool)[:, None, None, :]
  if causal:
    length = input_mask_BL.shape[1]
    mask_B11L = mask_B11L & jnp.tril(jnp.ones((length, length), bool))[None, None]
  return mask_B11L


def explicit_attention(q_BLHK, k_BLHK, v_BLHK, mask_B1LL, dtype, dropout=None):
  """Softmax attention with the probabilities materialised: (context, probabilities).

  Logits and softmax are float32 whatever the compute dtype; `dropout` (if given) is applied
  to the probabilities.
  """
  logits_BHLL = attention_scores(q_BLHK, k_BLHK) / jnp.sqrt(jnp.float32(q_BLHK.shape[-1]))
  logits_BHLL = jnp.where(mask_B1LL, logits_BHLL, jnp.finfo(jnp.float32).min)
  probs_BHLL = jax.nn.softmax(logits_BHLL, axis=-1)
  dropped_BHLL = probs_BHLL if dropout is None else dropout(probs_BHLL)
  ctx_BLHK = attention_context(dropped_BHLL.astype(dtype), v_BLHK)
  return ctx_BLHK.astype(dtype), probs_BHLL


def fused_attention(q_BLHK, k_BLHK, v_BLHK, mask_B1LL, dtype):
  """`jax.nn.dot_product_attention` (XLA implementation): no materialised probabilities."""
  ctx_BLHK = jax.nn.dot_product_attention(
    q_BLHK, k_BLHK, v_BLHK, mask=mask_B1LL, implementation="xla"
  )
  return ctx_BLHK.astype(dtype)


QKV = ("query", "key", "value")


class Layer(nn.Module):
  """One post-LN Transformer layer (self-attention, FFN), as the original BERT."""

  cfg: BertConfig
  deterministic: bool = True
  output_attentions: bool = False

  @nn.compact
  def __call__(
    self, x_BLD: Array, mask_B1LL: Array, positions_BQ: Array | None = None
  ) -> tuple[Array, Array | None]:
    """[B, L, D] -> [B, L, D]; with `positions_BQ`, only those positions' outputs: the queries,
    attention output and FFN run at the Q gathered positions, keys and values at all L."""
    cfg = self.cfg
    h, k = cfg.num_heads, cfg.head_dim
    xq_BQD = x_BLD if positions_BQ is None else gather_positions(x_BLD, positions_BQ)
    if positions_BQ is not None and mask_B1LL.shape[2] != 1:  # a causal mask: its query rows
      mask_B1LL = jnp.take_along_axis(mask_B1LL, positions_BQ[:, None, :, None], axis=2)
    qkv_axes = (sh.EMBED, sh.HEADS, sh.KV)
    if cfg.fuse_qkv:
      # One [D, 3, H, K] matmul: a wider N runs closer to the matmul peak than three [D, H, K].
      wbs = [Dense((h, k), qkv_axes, cfg, compute=False, name=n)(x_BLD) for n in QKV]
      w_D3HK = jnp.stack([w for w, _ in wbs], axis=1)
      b_3HK = jnp.stack([b for _, b in wbs])
      y_BL3HK = add_bias(matmul(x_BLD, w_D3HK, 1, cfg.compute_dtype, cfg.matmul_vjp), b_3HK)
      q_BLHK, k_BLHK, v_BLHK = (y_BL3HK[:, :, i] for i in range(3))
      if positions_BQ is not None:
        q_BLHK = gather_positions(q_BLHK, positions_BQ)
    else:
      q_BLHK = Dense((h, k), qkv_axes, cfg, name="query")(xq_BQD)
      k_BLHK, v_BLHK = (Dense((h, k), qkv_axes, cfg, name=n)(x_BLD) for n in QKV[1:])
    act = (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_HEADS, sh.ACT_KV)
    q_BLHK, k_BLHK, v_BLHK = (_constrain(t, act) for t in (q_BLHK, k_BLHK, v_BLHK))

    dropout_active = not self.deterministic and cfg.attention_dropout_prob > 0
    probs_BHLL = None
    if cfg.attention_impl == "fused" and not dropout_active and not self.output_attentions:
      ctx_BLHK = fused_attention(q_BLHK, k_BLHK, v_BLHK, mask_B1LL, cfg.compute_dtype)
    else:
      dropout = Dropout(cfg.attention_dropout_prob, cfg.dropout_rng)
      ctx_BLHK, probs_BHLL = explicit_attention(
        q_BLHK,
        k_BLHK,
        v_BLHK,
        mask_B1LL,
        cfg.compute_dtype,
        lambda p: dropout(p, deterministic=self.deterministic),
      )
    ctx_BLHK = _constrain(ctx_BLHK, act)

    out_BLD = Dense(
      (cfg.hidden_size,), (sh.HEADS, sh.KV, sh.EMBED), cfg, contract=2, name="attention_output"
    )(ctx_BLHK)
    out_BLD = Dropout(cfg.hidden_dropout_prob, cfg.dropout_rng)(
      out_BLD, deterministic=self.deterministic
    )
    x_BLD = layer_norm(cfg, "attention_LayerNorm")(out_BLD + xq_BQD)
    x_BLD = _constrain(x_BLD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

    ff_BLF = Dense((cfg.intermediate_size,), (sh.EMBED, sh.MLP), cfg, name="intermediate")(x_BLD)
    ff_BLF = _constrain(gelu(ff_BLF), (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_MLP))
    ff_BLD = Dense((cfg.hidden_size,), (sh.MLP, sh.EMBED), cfg, name="output")(ff_BLF)
    ff_BLD = Dropout(cfg.hidden_dropout_prob, cfg.dropout_rng)(
      ff_BLD, deterministic=self.deterministic
    )
    x_BLD = layer_norm(cfg, "output_LayerNorm")(ff_BLD + x_BLD)
    x_BLD = _constrain(x_BLD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))
    return x_BLD, probs_BHLL


class _ScanLayer(nn.Module):
  """Layer with the (carry, per-step output) signature nn.scan needs."""

  cfg: BertConfig
  deterministic: bool = True
  output_hidden_states: bool = False
  output_attentions: bool = False

  @nn.compact
  def __call__(self, x_BLD: Array, mask_B1LL: Array):
    layer_cls = _maybe_remat(Layer, self.cfg, prevent_cse=False)
    x_BLD, probs = layer_cls(self.cfg, self.deterministic, self.output_attentions, name="layer")(
      x_BLD, mask_B1LL
    )
    return x_BLD, (x_BLD if self.output_hidden_states else None, probs)


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
    mask_B1LL: Array,
    deterministic: bool,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    last_positions_BQ: Array | None = None,
  ):
    """`last_positions_BQ` (unrolled layers only): the last layer's outputs only at those
    positions ([B, Q, D]; see `BertConfig.prune_last_layer`)."""
    cfg = self.cfg
    hidden, attentions = [x_BLD], []
    if last_positions_BQ is not None and cfg.scan_layers:
      raise ValueError(
        "output positions (a pruned last layer) need unrolled layers: scan_layers=False"
      )
    if cfg.scan_layers:
      scanned = nn.scan(
        _ScanLayer,
        variable_axes={"params": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,),
        length=cfg.num_layers,
        metadata_params={nn.PARTITION_NAME: sh.LAYERS},
      )
      x_BLD, (h_NBLD, p_NBHLL) = scanned(
        cfg, deterministic, output_hidden_states, output_attentions, name="layers"
      )(x_BLD, mask_B1LL)
      if output_hidden_states:
        hidden += list(h_NBLD)
      if output_attentions:
        attentions = list(p_NBHLL)
    else:
      layer_cls = _maybe_remat(Layer, cfg, prevent_cse=True)
      for i in range(cfg.num_layers):
        last = last_positions_BQ if i == cfg.num_layers - 1 else None
        x_BLD, probs = layer_cls(cfg, deterministic, output_attentions, name=f"layer_{i}")(
          x_BLD, mask_B1LL, last
        )
        hidden.append(x_BLD)
        attentions.append(probs)
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
    mask_B1LL = attention_mask(input_mask_BL, self.cfg.causal)
    x_BLD, hidden, attentions = self.encoder(
      x_BLD, mask_B1LL, deterministic, output_hidden_states, output_attentions, output_positions_BQ
    )
    pooled_BD = jnp.tanh(self.pooler(x_BLD[:, 0]))
    out = {"sequence_output": x_BLD, "pooled_output": pooled_BD}
    if output_hidden_states:
      out["hidden_states"] = hidden
    if output_attentions:
      out["attentions"] = attentions
    return out


class MLMHead(nn.Module):
  """transform (dense + GELU + LayerNorm) then the tied decoder plus an output bias."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, h_BPD: Array, embeddings: Embeddings) -> Array:
    cfg = self.cfg
    h_BPD = Dense((cfg.hidden_size,), (sh.EMBED, sh.EMBED_OUT), cfg, name="transform")(h_BPD)
    h_BPD = layer_norm(cfg, "transform_LayerNorm")(gelu(h_BPD))
    bias_V = self.param("bias", _zeros((sh.VOCAB,)), (cfg.vocab_size,), cfg.storage_dtype)
    logits_BPV = add_bias(embeddings.attend(h_BPD), bias_V)
    return _constrain(logits_BPV, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_VOCAB))


def gather_positions(x_BL: Array, positions_BP: Array) -> Array:
  """x[B, L, ...] at positions[B, P] -> [B, P, ...]."""
  idx = positions_BP.astype(jnp.int32).reshape(positions_BP.shape + (1,) * (x_BL.ndim - 2))
  return jnp.take_along_axis(x_BL, idx, axis=1)


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
    # NSP logits in float32 whatever the compute dtype (a 2-way head: free).
    self.seq_relationship = Dense(
      (2,), (sh.EMBED, None), dataclasses.replace(self.cfg, dtype="float32")
    )

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
  at the 1 + predictions_per_seq positions it computes (keys and values at every position,
  and the queries too with `fuse_qkv`, whose one matmul covers all three).
  """
  n, d, f, v = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  per_layer = 6 * (4 * d * d + 2 * d * f) + 12 * d * seq_len
  encoder = n * per_layer
  if cfg.last_layer_prunable and predictions_per_seq < seq_len:
    q = (1 + predictions_per_seq) / seq_len  # share of positions the last layer computes
    every = 3 if cfg.fuse_qkv else 2  # D x D projections at every position
    last = 6 * every * d * d + q * (6 * ((4 - every) * d * d + 2 * d * f) + 12 * d * seq_len)
    encoder += last - per_layer
  head = 6 * (d * d + d * v) * predictions_per_seq / seq_len
  pooler_nsp = 6 * (d * d + 2 * d) / seq_len
  return float(encoder + head + pooler_nsp)
