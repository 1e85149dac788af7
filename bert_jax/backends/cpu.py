"""The XLA:CPU kernels BertConfig.kernels='cpu' runs (the CPU's 'auto'): the same values,
gradients and parameters as the stock ops (up to float32 summation order,
tests/unit/test_backends_cpu.py), in the forms XLA:CPU runs fast:

- `matmul`, `tied_logits`: custom VJPs that keep both backward dots in the compute dtype with
  float32 accumulators, and take the weight gradient from a transposed copy of the narrower
  operand (`_dw_cpu`), the layout XLA:CPU's fast dot kernels need.
- `attention_scores`, `attention_context`: low-precision custom VJPs whose backward dots stay
  in the operands' dtype and in operand orders XLA:CPU has bf16 kernels for.
- `add_bias`, `LayerNorm`: float32 bias and scale gradients (autodiff would sum a bf16
  cotangent with a bf16 accumulator: lossy, and far slower on XLA:CPU than a float32 sum).

Shape key: T tokens (leading dims flattened), I/O a dense layer's input/output features, and
for attention B batch, Q queries, S keys, H heads, K head dim.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def _dot_dims(x_ndim: int, contract: int):
  """dot_general dimension numbers contracting x's last `contract` dims with w's first."""
  return ((tuple(range(x_ndim - contract, x_ndim)), tuple(range(contract))), ((), ()))


# ----------------------------------------------------------------------------- dense matmul


def matmul(x: Array, w: Array, contract: int, dtype: Any) -> Array:
  """x[..., *c] @ w[*c, ...] with `dtype` operands and a float32 accumulator, result in
  `dtype`.

  The VJP computes dX = g . W^T and dW = X^T . g with `dtype` operands and float32
  accumulators (autodiff of a bf16 dot emits a bf16-accumulating dot, slow on XLA:CPU), dW on
  CPU through `_dw_cpu`'s layout. In float32 these are autodiff's dots; only dW's layout
  differs, which keeps every dot on XLA:CPU's fast (YNNPACK) kernels.
  """
  return _matmul(x, w, contract, jnp.dtype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x: Array, w: Array, contract: int, dtype) -> Array:
  y = jax.lax.dot_general(
    x.astype(dtype),
    w.astype(dtype),
    _dot_dims(x.ndim, contract),
    preferred_element_type=jnp.float32,
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
  return dx.astype(x_like.dtype), weight_grad(n_batch, xc, gc).astype(w_like.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def weight_grad(n_batch: int, x: Array, g: Array) -> Array:
  """dW = X^T . g over the leading `n_batch` dims: `_dw_cpu` on CPU, `_dw` elsewhere."""
  return jax.lax.platform_dependent(
    x, g, cpu=functools.partial(_dw_cpu, n_batch), default=functools.partial(_dw, n_batch)
  )


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
  """`_dw` in the layout XLA:CPU's dots are fast in: the left operand contracted on its minor
  dim. A dot contracting x[T, I] on T runs at about half speed in bf16 and leaves YNNPACK for
  a slower Eigen kernel in float32. So the narrower of X and g is first copied into a
  [features, T] layout: dW = X'^T . g, or dW = (g'^T . X)^T when X is the wider (the FFN output
  layer's inputs: a [D, T] copy and a small transposed result instead of an [F, T] copy)."""
  tokens = math.prod(x.shape[:n_batch])
  x_TI, g_TO = x.reshape(tokens, -1), g.reshape(tokens, -1)
  nn_dims = (((1,), (0,)), ((), ()))
  if x_TI.shape[1] <= g_TO.shape[1]:
    dw_IO = jax.lax.dot_general(
      _physical_t(x_TI), g_TO, nn_dims, preferred_element_type=jnp.float32
    )
  else:
    dw_OI = jax.lax.dot_general(
      _physical_t(g_TO), x_TI, nn_dims, preferred_element_type=jnp.float32
    )
    dw_IO = _physical_t(dw_OI)
  return dw_IO.reshape(x.shape[n_batch:] + g.shape[n_batch:])


# ----------------------------------------------------------------------------- tied decoder


def tied_logits(h: Array, table_VD: Array, dtype: Any) -> Array:
  """float32 logits h[..., D] . table[V, D]^T with `dtype` operands.

  Below float32 a custom VJP runs both backward dots with `dtype` operands too (autodiff would
  run them on the float32 cotangent of the float32 logits), the table gradient through
  `weight_grad`'s CPU layout."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    dims = (((h.ndim - 1,), (1,)), ((), ()))
    return jax.lax.dot_general(h.astype(jnp.float32), table_VD.astype(jnp.float32), dims)
  return _tied_logits(h, table_VD, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _tied_logits(h: Array, table_VD: Array, dtype) -> Array:
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
  dt = weight_grad(g.ndim - 1, gc, hc)
  return dh.astype(h_like.dtype), dt.astype(t_like.dtype)


_tied_logits.defvjp(_tied_fwd, _tied_bwd)


# ----------------------------------------------------------------------------- attention


def _f32_einsum(spec: str, a: Array, b: Array) -> Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _attention_einsum(spec: str, da_spec: str, db_spec: str, db_cotangent_first: bool):
  """einsum(spec, a, b) in float32; below float32 through a custom VJP whose backward dots
  keep the operands' dtype (autodiff would run them on float32 cotangents, about 3x slower in
  bf16 on XLA:CPU) in operand orders XLA:CPU has bf16 kernels for: dA = einsum(da_spec, g, b),
  dB = einsum(db_spec, g, a) or einsum(db_spec, a, g) (bqhk,bhqs->bshk has no bf16 kernel)."""

  @jax.custom_vjp
  def low_precision(a, b):
    return _f32_einsum(spec, a, b)

  def fwd(a, b):
    return low_precision(a, b), (a, b)

  def bwd(res, g):
    a, b = res
    g = g.astype(a.dtype)
    da = _f32_einsum(da_spec, g, b)
    db = _f32_einsum(db_spec, *((g, a) if db_cotangent_first else (a, g)))
    return da.astype(a.dtype), db.astype(b.dtype)

  low_precision.defvjp(fwd, bwd)

  def op(a: Array, b: Array) -> Array:
    if a.dtype == jnp.float32 and b.dtype == jnp.float32:
      return _f32_einsum(spec, a, b)
    return low_precision(a, b)

  return op


# float32 [B, H, Q, S] = q_BQHK . k_BSHK per head.
attention_scores = _attention_einsum(
  "bqhk,bshk->bhqs", "bhqs,bshk->bqhk", "bhqs,bqhk->bshk", db_cotangent_first=True
)
# float32 [B, Q, H, K] = p_BHQS . v_BSHK per head.
attention_context = _attention_einsum(
  "bhqs,bshk->bqhk", "bqhk,bshk->bhqs", "bhqs,bqhk->bshk", db_cotangent_first=False
)


# ----------------------------------------------------------------------------- bias, LayerNorm


@jax.custom_vjp
def add_bias(y: Array, b: Array) -> Array:
  """y[..., *F] + b[*F] in y's dtype; the bias gradient is a float32 sum over the leading
  axes."""
  return y + b.astype(y.dtype)


def _add_bias_fwd(y, b):
  # A zero-size residual carries b's rank and dtype.
  return add_bias(y, b), jnp.zeros((0,) * b.ndim, b.dtype)


def _add_bias_bwd(b_like, g):
  lead = tuple(range(g.ndim - b_like.ndim))
  return g, jnp.sum(g, axis=lead, dtype=jnp.float32).astype(b_like.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis, with nn.LayerNorm's parameters (`scale`, `bias`) and
  constructor fields, computed entirely in float32 whatever the compute dtype (only the output
  is cast), so the scale and bias gradients are float32 sums over the tokens."""

  epsilon: float = 1e-6
  dtype: Any = None
  param_dtype: Any = jnp.float32
  scale_init: Callable = nn.initializers.ones_init()
  bias_init: Callable = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = x.shape[-1]
    scale = self.param("scale", self.scale_init, (features,), self.param_dtype)
    bias = self.param("bias", self.bias_init, (features,), self.param_dtype)
    x32 = x.astype(jnp.float32)
    centered = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
    y = centered * jax.lax.rsqrt(var + self.epsilon)
    y = y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(self.dtype or x.dtype)
