"""Post-LN's residual in one Pallas kernel (kernels='fused'): y = LayerNorm(x + dropout(h)) over
the hidden axis, where XLA runs the dropout's mask compare, the add, the statistics and the
normalisation as separate fusions, and in the backward the LayerNorm gradient's reductions,
the dropout's select and the scale and bias gradients.

The keep-mask is `dropout.keep_mask`'s counter hash of each element's flat index in h, drawn
inside the kernels from the seed words `Dropout.hash_seed` gives, so the fused sublayer drops
exactly what `Dropout` with dropout_rng='hash' and the same rng drops. Statistics and every
intermediate are float32; the output is cast to the LayerNorm's dtype.

Forward: one program per block of rows holds whole rows (the hidden axis padded to a power
of two, Triton's tile; loads and stores masked to the real columns) and writes y. Backward:
one program per larger block of rows loops over it in forward-sized pieces, recomputes x +
dropout(h) and the statistics (nothing but the inputs is saved), writes dx and dh, and sums
its rows' scale and bias gradients into one row of per-program partial sums, which are summed
after the kernel.

Under a mesh the kernels run per shard of the batch axes (`jax.shard_map`), the hash index
offset by the shard's first global row: the same mask on any mesh. On CPU they run in Pallas'
interpreter (`interpret=True`; for tests). Shape key: R rows (every axis but the last), D
hidden, Dp D padded to a power of two.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec

from bert_jax import backends
from bert_jax import sharding as sh
from bert_jax.backends import dropout, flash
from bert_jax.model_config import BertConfig

Array = jax.Array

# Elements of one forward block (rows x Dp): 4 rows of BERT-Base/Large's 1024-wide padded
# hidden axis, 32 of a 128-wide one; the backward loops over up to BWD_STEPS such pieces.
BLOCK_ELEMENTS = 4096
BWD_STEPS = 16
# The backward's programs: enough to fill a GPU's SMs a few times over before a program takes
# more rows (fewer programs: fewer partial-sum rows to add after).
BWD_MIN_PROGRAMS = 512


@dataclasses.dataclass(frozen=True)
class _Static:
  """Everything the kernels specialise on (hashable: custom_vjp's nondiff argument)."""

  rows: int  # R of this shard
  hidden: int  # D: the hash index's row stride and the statistics' divisor
  block_rows: int  # rows a forward program (and each step of a backward program) holds
  bwd_steps: int  # pieces of block_rows a backward program loops over
  rate: float
  epsilon: float
  out_dtype: Any
  interpret: bool

  @property
  def padded(self) -> int:
    return max(16, pl.next_power_of_2(self.hidden))

  @property
  def dropping(self) -> bool:
    return self.rate > 0.0

  @property
  def num_warps(self) -> int:
    return min(8, max(1, self.block_rows * self.padded // 1024))


# ----------------------------------------------------------------------------- tile math


def _program_row(x_ref):
  """This program's first row in the shard's R (read outside loops: the interpreter only
  substitutes program ids at the kernel's top level)."""
  return pl.program_id(0) * x_ref.shape[0]


def _tile(st: _Static, hash_ref, x_ref, h_ref, program_row, first_row):
  """(z = x + dropout(h), the real-element mask, the keep bits or None) of the rows
  first_row .. first_row + block_rows of this program's refs, in float32 (zero off the mask)."""
  n, dp = st.block_rows, st.padded
  cols = jnp.arange(dp)
  row_base = program_row + first_row + jnp.arange(n)  # the shard's row of each tile row
  valid = (row_base < st.rows)[:, None] & (cols < st.hidden)[None, :]
  piece = (pl.ds(first_row, n), slice(None))
  x = plgpu.load(x_ref.at[piece], mask=valid, other=0.0).astype(jnp.float32)
  h = plgpu.load(h_ref.at[piece], mask=valid, other=0.0).astype(jnp.float32)
  keep = None
  if st.dropping:
    row_idx = (row_base.astype(jnp.uint32) + hash_ref[2]) * jnp.uint32(st.hidden)
    idx = row_idx[:, None] + cols.astype(jnp.uint32)[None, :]
    keep = dropout.hash_keep(idx, hash_ref[0], hash_ref[1], st.rate)
    h = jnp.where(keep, h / (1.0 - st.rate), 0.0)
  return x + h, valid, keep


def _normalised(st: _Static, z, valid):
  """(z's normalised rows, zero off the mask; 1 / std per row): float32 statistics."""
  mean = jnp.sum(z, axis=1) / st.hidden
  centered = jnp.where(valid, z - mean[:, None], 0.0)
  var = jnp.sum(centered * centered, axis=1) / st.hidden
  rstd = lax.rsqrt(var + st.epsilon)
  return centered * rstd[:, None], rstd


# ----------------------------------------------------------------------------- kernels


def _fwd_kernel(hash_ref, x_ref, h_ref, scale_ref, bias_ref, y_ref, *, st: _Static):
  z, valid, _ = _tile(st, hash_ref, x_ref, h_ref, _program_row(x_ref), 0)
  xhat, _ = _normalised(st, z, valid)
  cols = jnp.arange(st.padded) < st.hidden
  scale = plgpu.load(scale_ref, mask=cols, other=0.0).astype(jnp.float32)
  bias = plgpu.load(bias_ref, mask=cols, other=0.0).astype(jnp.float32)
  y = xhat * scale[None, :] + bias[None, :]
  plgpu.store(y_ref, y.astype(y_ref.dtype), mask=valid)


def _bwd_kernel(
  hash_ref, x_ref, h_ref, scale_ref, dy_ref, dx_ref, dh_ref, dscale_ref, dbias_ref, *, st: _Static
):
  cols = jnp.arange(st.padded) < st.hidden
  scale = plgpu.load(scale_ref, mask=cols, other=0.0).astype(jnp.float32)
  program_row = _program_row(x_ref)

  def body(step, sums):
    dscale, dbias = sums
    first = step * st.block_rows
    z, valid, keep = _tile(st, hash_ref, x_ref, h_ref, program_row, first)
    xhat, rstd = _normalised(st, z, valid)
    piece = (pl.ds(first, st.block_rows), slice(None))
    dy = plgpu.load(dy_ref.at[piece], mask=valid, other=0.0).astype(jnp.float32)
    g = dy * scale[None, :]
    # d/dz of LayerNorm: (g - mean(g) - xhat * mean(g * xhat)) / std, means over the D columns.
    mean_g = jnp.sum(g, axis=1) / st.hidden
    mean_gx = jnp.sum(g * xhat, axis=1) / st.hidden
    dz = (g - mean_g[:, None] - xhat * mean_gx[:, None]) * rstd[:, None]
    plgpu.store(dx_ref.at[piece], dz.astype(dx_ref.dtype), mask=valid)
    dh = dz if keep is None else jnp.where(keep, dz / (1.0 - st.rate), 0.0)
    plgpu.store(dh_ref.at[piece], dh.astype(dh_ref.dtype), mask=valid)
    return dscale + jnp.sum(dy * xhat, axis=0), dbias + jnp.sum(dy, axis=0)

  zeros = jnp.zeros((st.padded,), jnp.float32)
  dscale, dbias = lax.fori_loop(0, st.bwd_steps, body, (zeros, zeros))
  plgpu.store(dscale_ref, dscale, mask=cols)
  plgpu.store(dbias_ref, dbias, mask=cols)


# ----------------------------------------------------------------------------- pallas calls


def _rows_spec(st: _Static, rows: int) -> pl.BlockSpec:
  return pl.BlockSpec((rows, st.padded), lambda i: (i, 0))


def _vector_spec(st: _Static) -> pl.BlockSpec:
  return pl.BlockSpec((st.padded,), lambda i: (0,))


def _hash_spec() -> pl.BlockSpec:
  return pl.BlockSpec((4,), lambda i: (0,))


def _pallas(kernel, st: _Static, name: str, grid: int, in_specs, out_specs, out_shape):
  return pl.pallas_call(
    functools.partial(kernel, st=st),
    grid=(grid,),
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    # Triton's parameters also pick the Triton lowering (Pallas' default on a GPU is Mosaic).
    compiler_params=plgpu.CompilerParams(num_warps=st.num_warps, num_stages=1),
    interpret=st.interpret,
    name=name,
  )


@functools.partial(jax.jit, static_argnums=0)
def _forward(st: _Static, hash_w, x_RD, h_RD, scale_D, bias_D) -> Array:
  return _pallas(
    _fwd_kernel,
    st,
    "dropout_add_layer_norm_fwd",
    pl.cdiv(st.rows, st.block_rows),
    [_hash_spec(), _rows_spec(st, st.block_rows), _rows_spec(st, st.block_rows)]
    + [_vector_spec(st)] * 2,
    _rows_spec(st, st.block_rows),
    jax.ShapeDtypeStruct(x_RD.shape, st.out_dtype),
  )(hash_w, x_RD, h_RD, scale_D, bias_D)


@functools.partial(jax.jit, static_argnums=0)
def _backward(st: _Static, hash_w, x_RD, h_RD, scale_D, dy_RD):
  """(dx, dh, dscale, dbias): the scale and bias gradients as float32 sums of the programs'
  partial sums."""
  rows = st.block_rows * st.bwd_steps
  programs = pl.cdiv(st.rows, rows)
  partial = jax.ShapeDtypeStruct((programs, st.hidden), jnp.float32)
  partial_spec = pl.BlockSpec((None, st.padded), lambda i: (i, 0))
  dx, dh, dscale, dbias = _pallas(
    _bwd_kernel,
    st,
    "dropout_add_layer_norm_bwd",
    programs,
    [_hash_spec(), _rows_spec(st, rows), _rows_spec(st, rows), _vector_spec(st)]
    + [_rows_spec(st, rows)],
    [_rows_spec(st, rows), _rows_spec(st, rows), partial_spec, partial_spec],
    [
      jax.ShapeDtypeStruct(x_RD.shape, x_RD.dtype),
      jax.ShapeDtypeStruct(h_RD.shape, h_RD.dtype),
      partial,
      partial,
    ],
  )(hash_w, x_RD, h_RD, scale_D, dy_RD)
  return dx, dh, jnp.sum(dscale, axis=0), jnp.sum(dbias, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(st: _Static, hash_w, x_RD, h_RD, scale_D, bias_D):
  return _forward(st, hash_w, x_RD, h_RD, scale_D, bias_D)


def _fused_fwd(st, hash_w, x_RD, h_RD, scale_D, bias_D):
  return _forward(st, hash_w, x_RD, h_RD, scale_D, bias_D), (hash_w, x_RD, h_RD, scale_D, bias_D)


def _fused_bwd(st, res, dy_RD):
  hash_w, x_RD, h_RD, scale_D, bias_D = res
  dx, dh, dscale, dbias = _backward(st, hash_w, x_RD, h_RD, scale_D, dy_RD)
  return None, dx, dh, dscale.astype(scale_D.dtype), dbias.astype(bias_D.dtype)


_fused.defvjp(_fused_fwd, _fused_bwd)


# ----------------------------------------------------------------------------- entry points


def _static(rows: int, hidden: int, **fields) -> _Static:
  """The tile sizes for R rows of D: BLOCK_ELEMENTS per forward block, and backward programs
  of up to BWD_STEPS blocks while at least BWD_MIN_PROGRAMS remain (powers of two: Triton's)."""
  padded = max(16, pl.next_power_of_2(hidden))
  block_rows = max(1, BLOCK_ELEMENTS // padded)
  steps = 1
  while steps < BWD_STEPS and pl.cdiv(rows, 2 * steps * block_rows) >= BWD_MIN_PROGRAMS:
    steps *= 2
  return _Static(rows=rows, hidden=hidden, block_rows=block_rows, bwd_steps=steps, **fields)


def _local(x, h, scale_D, bias_D, seed_w, row_offset, rate, epsilon, out_dtype, interpret):
  """One shard's fused residual LayerNorm over the last axis of x and h (any leading shape)."""
  hidden = x.shape[-1]
  rows = math.prod(x.shape[:-1])
  st = _static(
    rows, hidden, rate=rate, epsilon=epsilon, out_dtype=jnp.dtype(out_dtype), interpret=interpret
  )
  hash_w = jnp.concatenate(
    [seed_w.astype(jnp.uint32), jnp.stack([jnp.asarray(row_offset, jnp.uint32), jnp.uint32(0)])]
  )
  y = _fused(st, hash_w, x.reshape(rows, hidden), h.reshape(rows, hidden), scale_D, bias_D)
  return y.reshape(x.shape)


def dropout_add_layer_norm(
  x: Array,
  h: Array,
  scale_D: Array,
  bias_D: Array,
  *,
  epsilon: float,
  dropout_rate: float = 0.0,
  dropout_seed: Array | None = None,
  out_dtype: Any = None,
  interpret: bool = False,
  batch_axes: str | Sequence[str] | None = None,
) -> Array:
  """LayerNorm(x + dropout(h)) over the last axis with float32 statistics, in `out_dtype`
  (default x's): equal to `dropout.dropout(h, keep, rate)` added to x and normalised as
  `cpu.LayerNorm` does, where keep is `dropout.keep_mask` of h's shape with the seed words
  `dropout_seed` (`dropout.hash_seed(key)`; needed when `dropout_rate` > 0).

  Under a mesh (`jax.set_mesh`) `batch_axes` names the mesh axes the leading axis is split
  over (as the logical rules place it); the kernels then run per shard."""
  if x.shape != h.shape or scale_D.shape != (x.shape[-1],) or bias_D.shape != scale_D.shape:
    raise ValueError(f"x {x.shape}, h {h.shape}, scale {scale_D.shape}, bias {bias_D.shape}")
  if dropout_rate >= 1.0:  # as Dropout: everything dropped
    h, dropout_rate = jnp.zeros_like(h), 0.0
  if dropout_rate > 0.0 and dropout_seed is None:
    raise ValueError("dropout_rate > 0 needs dropout_seed (dropout.hash_seed of a key)")
  seed_w = jnp.zeros((2,), jnp.uint32) if dropout_rate <= 0.0 else dropout_seed
  local = functools.partial(
    _local,
    rate=max(float(dropout_rate), 0.0),
    epsilon=float(epsilon),
    out_dtype=out_dtype or x.dtype,
    interpret=interpret,
  )
  mesh = jax.sharding.get_abstract_mesh()
  batch_axes = () if mesh.empty else flash._axes_dividing(batch_axes, x.shape[0], mesh)
  if not batch_axes:
    return local(x, h, scale_D, bias_D, seed_w, 0)

  def shard(seed_w, x, h, scale_D, bias_D):
    rows = math.prod(x.shape[:-1])  # this shard's
    return local(x, h, scale_D, bias_D, seed_w, lax.axis_index(batch_axes) * rows)

  rows_spec = PartitionSpec(batch_axes, *[None] * (x.ndim - 1))
  return jax.shard_map(
    shard,
    in_specs=(PartitionSpec(), rows_spec, rows_spec, PartitionSpec(), PartitionSpec()),
    out_specs=rows_spec,
    check_vma=False,
  )(seed_w, x, h, scale_D, bias_D)


# ----------------------------------------------------------------------------- the model's


# Whether Pallas interprets the fused kernels, per platform (GPU: Triton; CPU: for tests).
INTERPRET = {"gpu": False, "cpu": True}


def interpret_on(cfg: BertConfig) -> bool:
  """Whether kernels='fused' runs in Pallas' interpreter on cfg's platform (a platform without
  the kernels is a ValueError)."""
  platform = backends.resolved(cfg).platform
  if platform not in INTERPRET:
    raise ValueError(
      f"kernels='fused' runs on GPUs (Triton) and, interpreted, on CPUs; not on {platform}"
    )
  return INTERPRET[platform]


class DropoutAddNorm(nn.Module):
  """`LayerNorm(x + dropout(h))` in the fused kernels, with a LayerNorm's parameters (`scale`,
  `bias`: nn.LayerNorm's names, shapes and constructor fields), so a checkpoint reads the same
  whichever runs."""

  epsilon: float = 1e-6
  dtype: Any = None
  param_dtype: Any = jnp.float32
  scale_init: Callable = nn.initializers.ones_init()
  bias_init: Callable = nn.initializers.zeros_init()
  rate: float = 0.0
  interpret: bool = False

  @nn.compact
  def __call__(self, h: Array, x: Array, seed_w: Array | None) -> Array:
    """`seed_w`: the dropout's hash seed words, None for no dropout."""
    features = x.shape[-1]
    scale = self.param("scale", self.scale_init, (features,), self.param_dtype)
    bias = self.param("bias", self.bias_init, (features,), self.param_dtype)
    (batch_axes,) = nn.logical_to_mesh_axes((sh.ACT_BATCH,))
    return dropout_add_layer_norm(
      x,
      h,
      scale,
      bias,
      epsilon=self.epsilon,
      dropout_rate=0.0 if seed_w is None else self.rate,
      dropout_seed=seed_w,
      out_dtype=self.dtype or x.dtype,
      interpret=self.interpret,
      batch_axes=batch_axes,
    )


def dropout_add_norm(
  cfg: BertConfig, name: str, norm_fields: dict[str, Any], h: Array, x: Array, deterministic: bool
) -> Array:
  """Post-LN's residual: LayerNorm(x + dropout(h)) with cfg's hidden dropout, the LayerNorm
  (`norm_fields`: nn.LayerNorm's constructor fields) a submodule `name` of the calling module
  and the dropout a `dropout.Dropout` made in it. kernels='fused' runs it in the fused kernels
  (the 'hash' mask whatever dropout_rng: the seeds that Dropout's keep_mask would hash with),
  every other value as dropout, add and `backends.ops_for(cfg).layer_norm`."""
  drop = dropout.for_config(cfg, cfg.hidden_dropout_prob)
  if backends.resolved(cfg).kernels != "fused":
    norm = backends.ops_for(cfg).layer_norm(**norm_fields, name=name)
    return norm(drop(h, deterministic=deterministic) + x)
  dropping = not deterministic and drop.rate > 0.0
  norm = DropoutAddNorm(**norm_fields, rate=drop.rate, interpret=interpret_on(cfg), name=name)
  return norm(h, x, drop.hash_seed() if dropping else None)
