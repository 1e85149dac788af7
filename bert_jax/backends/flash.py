"""Flash attention with attention dropout, in Pallas for GPUs (the Triton lowering): the
probabilities are never materialised, and the dropout mask is `dropout.keep_mask`'s counter
hash of each probability's flat [B, H, Q, S] index, so `flash_attention` drops exactly the
probabilities that explicit attention with `dropout_rng='hash'` drops (same seeds).

Forward (FlashAttention-2): one program per (query block, batch, head) runs an online softmax
over key blocks and saves per-row statistics (max m, in base 2, and 1 / sum) for the backward,
whose two kernels recompute the probabilities from them: dK/dV per key block (looping over query
blocks) and dQ per query block (looping over key blocks), each recomputing the same hash bits;
or, with `BlockSizes.one_pass_bwd`, the dK/dV kernel alone, writing each key block's float32
share of dQ for XLA to sum (deterministic, unlike FlashAttention-2's atomic adds).
Masking is `attention.attention_mask`'s, from the compact inputs: keys where input_mask is 0 are
never attended, causal rows only attend keys at or before their position; a fully masked row
attends every key uniformly, as softmax over equal `finfo.min` logits does in the explicit path.

Under a mesh the kernels run per shard (`jax.shard_map` over the batch and head axes), and the
hash indices are offset by the shard's global (batch, head) position: the same mask on any mesh.
On CPU the kernels run in Pallas' interpreter (`interpret=True`; slow, for tests).

Shape key: B batch, Q queries, S keys, H heads, K head dim; Qp, Sp, Kp the padded lengths the
kernels run on.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec

from bert_jax.backends import dropout

Array = jax.Array

LOG2E = math.log2(math.e)
# The masked logit of the explicit path (attention.explicit_attention), here in base 2: equal
# masked logits in a fully masked row give it uniform probabilities, as there.
MASK_VALUE = float(jnp.finfo(jnp.float32).min)
# Lengths are padded to a multiple of this (Triton's smallest dot tile).
MIN_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes (powers of two; clipped to the largest power of two dividing the padded
  length). Each kernel holds one block in registers and loops over the other axis:
  forward and dQ hold a query block, dK/dV a key block. The held block is the larger: it is
  reused across the loop, and the per-element hash and masking work scale with the tile."""

  fwd_q: int = 64
  fwd_k: int = 64
  dkv_q: int = 32
  dkv_k: int = 64
  dq_q: int = 64
  dq_k: int = 32
  # One backward kernel: the dK/dV kernel also writes its key block's share of dQ (float32,
  # [S / dkv_k, B, Q, H, K] summed by XLA) and the dQ kernel does not run, so the backward
  # computes the probabilities, their dropout bits and dP once per tile instead of twice.
  one_pass_bwd: bool = False
  # Triton's launch parameters, per kernel.
  fwd_warps: int = 4
  dkv_warps: int = 4
  dq_warps: int = 4
  fwd_stages: int = 2
  dkv_stages: int = 2
  dq_stages: int = 2


DEFAULT_BLOCKS = BlockSizes()


@dataclasses.dataclass(frozen=True)
class _Static:
  """Everything the kernels specialise on (hashable: custom_vjp's nondiff argument)."""

  q_len: int  # Q and S unpadded: the hash's flat index is over [B, H, Q, S]
  k_len: int
  heads: int  # H over all shards (the index's head stride)
  head_dim: int  # K unpadded (the scale)
  causal: bool
  rate: float
  blocks: BlockSizes
  interpret: bool

  @property
  def dropping(self) -> bool:
    return self.rate > 0.0

  @property
  def keep_prob(self) -> float:
    return 1.0 - self.rate

  @property
  def scale(self) -> float:
    return 1.0 / math.sqrt(self.head_dim)

  @property
  def scale2(self) -> float:
    """The logit scale times log2(e): the kernels' softmax runs in base 2 (exp2)."""
    return self.scale * LOG2E


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _dot(a: Array, b: Array, ta: bool = False, tb: bool = False) -> Array:
  """a @ b (a.T / b.T when ta / tb) with a float32 accumulator."""
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- tile math


def _probs(st: _Static, hash_ref, base, q, k, rows, cols, valid_k, qpos, m=None, linv=None):
  """One [rows, cols] tile: (base-2 logits or, given the saved row statistics m and linv,
  the probabilities; where the explicit mask allows; the keep bits, or None without dropout).

  Keys beyond S (padding to a block multiple) get -inf, not MASK_VALUE: a fully masked row is
  uniform over the S real keys, as in the explicit path."""
  x = _dot(q, k, tb=True) * st.scale2
  allowed = valid_k[None, :] != 0
  if st.causal:
    allowed = allowed & (qpos[:, None] >= cols[None, :])
  x = jnp.where(allowed, x, MASK_VALUE)
  if st.k_len % MIN_BLOCK:  # S was padded
    x = jnp.where(cols[None, :] < st.k_len, x, -jnp.inf)
  if m is not None:
    x = jnp.exp2(x - m[:, None]) * linv[:, None]
  keep = _keep(st, hash_ref, base, rows, cols) if st.dropping else None
  return x, allowed, keep


def _row_base(st: _Static, hash_ref):
  """The flat [B, H, Q, S] index of this program's (b, h, 0, 0), over Q * S: the hash index
  of tile element (row, col) is (base + row) * S + col. Read outside the kernels' loops (the
  interpreter only substitutes program ids at the kernel's top level)."""
  b = pl.program_id(1).astype(jnp.uint32)
  h = pl.program_id(2).astype(jnp.uint32)
  bh = b * jnp.uint32(st.heads) + h + hash_ref[2]  # hash_ref[2]: this shard's first global (b, h)
  return bh * jnp.uint32(st.q_len)


def _keep(st: _Static, hash_ref, base, rows, cols):
  """keep_mask's bit of each tile element: the hash of element (b, h, row, col)'s flat index
  in [B, H, Q, S] with the seed words hash_ref[0:2] (uint32 arithmetic wraps as XLA's)."""
  row_idx = (base + rows.astype(jnp.uint32)) * jnp.uint32(st.k_len)
  idx = row_idx[:, None] + cols.astype(jnp.uint32)[None, :]
  return dropout.hash_keep(idx, hash_ref[0], hash_ref[1], st.rate)


def _dropped(st: _Static, x, keep):
  """Dropout's select: x / keep_prob where kept, else 0."""
  return x if keep is None else jnp.where(keep, x * (1.0 / st.keep_prob), 0.0)


def _tile_grads(st: _Static, p, allowed, keep, do, v, delta):
  """(dropped probabilities z, logit gradient ds) of a tile: with O = z . V,
  dz = dO . V^T, dp = dropout(dz), ds = p * (dp - rowsum(dO * O)) where the mask allows (the
  explicit path's `where` passes no gradient to masked logits)."""
  dp = _dropped(st, _dot(do, v, tb=True), keep)
  ds = jnp.where(allowed, p * (dp - delta[:, None]), 0.0)
  return _dropped(st, p, keep), ds


# ----------------------------------------------------------------------------- kernels


def _fwd_kernel(hash_ref, q_ref, k_ref, v_ref, valid_ref, qpos_ref, o_ref, m_ref, linv_ref, *, st):
  bq, bk = q_ref.shape[0], st.blocks.fwd_k
  rows = pl.program_id(0) * bq + jnp.arange(bq)
  base = _row_base(st, hash_ref)
  q = q_ref[...]
  qpos = qpos_ref[...] if st.causal else None  # positions only matter to the causal mask

  def body(j, carry):
    acc, m, total = carry
    ks = pl.ds(j * bk, bk)
    cols = j * bk + jnp.arange(bk)
    x, _, keep = _probs(st, hash_ref, base, q, k_ref[ks, :], rows, cols, valid_ref[ks], qpos)
    m_new = jnp.maximum(m, jnp.max(x, axis=1))
    correction = jnp.exp2(m - m_new)
    p = jnp.exp2(x - m_new[:, None])
    total = total * correction + jnp.sum(p, axis=1)
    v = v_ref[ks, :]
    acc = acc * correction[:, None] + _dot(_dropped(st, p, keep).astype(v.dtype), v)
    return acc, m_new, total

  acc = jnp.zeros(q.shape, jnp.float32)
  m = jnp.full((bq,), -jnp.inf, jnp.float32)
  total = jnp.zeros((bq,), jnp.float32)
  # Key block 0 holds a real key: m is finite after the first step (never -inf - -inf).
  acc, m, total = lax.fori_loop(0, k_ref.shape[0] // bk, body, (acc, m, total))
  linv = 1.0 / total
  o_ref[...] = (acc * linv[:, None]).astype(o_ref.dtype)
  m_ref[...] = m
  linv_ref[...] = linv


def _dkv_kernel(
  hash_ref, q_ref, k_ref, v_ref, valid_ref, qpos_ref, do_ref, m_ref, linv_ref, delta_ref,
  dk_ref, dv_ref, dq_ref=None, *, st
):  # fmt: skip
  bk, bq = k_ref.shape[0], st.blocks.dkv_q
  cols = pl.program_id(0) * bk + jnp.arange(bk)
  base = _row_base(st, hash_ref)
  k, v, valid = k_ref[...], v_ref[...], valid_ref[...]

  def body(i, carry):
    dk, dv = carry
    qs = pl.ds(i * bq, bq)
    rows = i * bq + jnp.arange(bq)
    q, do = q_ref[qs, :], do_ref[qs, :]
    qpos = qpos_ref[qs] if st.causal else None
    m, linv = m_ref[qs], linv_ref[qs]
    p, allowed, keep = _probs(st, hash_ref, base, q, k, rows, cols, valid, qpos, m, linv)
    z, ds = _tile_grads(st, p, allowed, keep, do, v, delta_ref[qs])
    dv = dv + _dot(z.astype(do.dtype), do, ta=True)
    dk = dk + _dot(ds.astype(q.dtype), q, ta=True)
    if dq_ref is not None:  # one_pass_bwd: this key block's share of dQ
      dq_ref[qs, :] = _dot(ds.astype(k.dtype), k)
    return dk, dv

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = lax.fori_loop(0, q_ref.shape[0] // bq, body, (zeros, zeros))
  dk_ref[...] = (dk * st.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(
  hash_ref, q_ref, k_ref, v_ref, valid_ref, qpos_ref, do_ref, m_ref, linv_ref, delta_ref,
  dq_ref, *, st
):  # fmt: skip
  bq, bk = q_ref.shape[0], st.blocks.dq_k
  rows = pl.program_id(0) * bq + jnp.arange(bq)
  base = _row_base(st, hash_ref)
  q, do, m, linv, delta = q_ref[...], do_ref[...], m_ref[...], linv_ref[...], delta_ref[...]
  qpos = qpos_ref[...] if st.causal else None

  def body(j, dq):
    ks = pl.ds(j * bk, bk)
    cols = j * bk + jnp.arange(bk)
    k = k_ref[ks, :]
    p, allowed, keep = _probs(st, hash_ref, base, q, k, rows, cols, valid_ref[ks], qpos, m, linv)
    _, ds = _tile_grads(st, p, allowed, keep, do, v_ref[ks, :], delta)
    return dq + _dot(ds.astype(k.dtype), k)

  dq = lax.fori_loop(0, k_ref.shape[0] // bk, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * st.scale).astype(dq_ref.dtype)


# ----------------------------------------------------------------------------- pallas calls
# Every grid is (blocks of the held axis, B, H); `blocked` specs follow the held axis' blocks,
# the others give the kernel the whole padded length.


def _seq_spec(block: int, k_pad: int, blocked: bool) -> pl.BlockSpec:
  """A [B, L, H, Kp] array's (b, h) rows: a block of them, or all."""
  if blocked:
    return pl.BlockSpec((None, block, None, k_pad), lambda i, b, h: (b, i, h, 0))
  return pl.BlockSpec((None, block, None, k_pad), lambda i, b, h: (b, 0, h, 0))


def _row_spec(block: int, blocked: bool) -> pl.BlockSpec:
  """A [B, L] array's row b."""
  if blocked:
    return pl.BlockSpec((None, block), lambda i, b, h: (b, i))
  return pl.BlockSpec((None, block), lambda i, b, h: (b, 0))


def _stat_spec(block: int, blocked: bool) -> pl.BlockSpec:
  """A [B, H, Qp] statistics array's row (b, h)."""
  if blocked:
    return pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))
  return pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, 0))


def _in_specs(q_block: int, k_block: int, k_pad: int, by_q: bool) -> list[pl.BlockSpec]:
  """The kernels' inputs in order (hash words, q, k, v, valid, qpos, then the backward's dO,
  m, 1/l, delta): the held axis in blocks (queries if by_q, else keys), the other whole."""
  by_k = not by_q
  return [
    pl.BlockSpec((4,), lambda i, b, h: (0,)),
    _seq_spec(q_block, k_pad, by_q),
    _seq_spec(k_block, k_pad, by_k),
    _seq_spec(k_block, k_pad, by_k),
    _row_spec(k_block, by_k),
    _row_spec(q_block, by_q),
    _seq_spec(q_block, k_pad, by_q),
    *[_stat_spec(q_block, by_q)] * 3,
  ]


def _pallas(kernel, st: _Static, name: str, which: str, grid, in_specs, out_specs, out_shape):
  """`kernel` as a Pallas call named `name`, with the launch parameters of `which` kernel
  (fwd, dkv or dq) from st.blocks."""
  return pl.pallas_call(
    functools.partial(kernel, st=st),
    grid=grid,
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    # Triton's parameters also pick the Triton lowering (Pallas' default on a GPU is Mosaic).
    compiler_params=plgpu.CompilerParams(
      num_warps=getattr(st.blocks, f"{which}_warps"),
      num_stages=getattr(st.blocks, f"{which}_stages"),
    ),
    interpret=st.interpret,
    name=name,
  )


@functools.partial(jax.jit, static_argnums=0)
def _forward(st: _Static, hash_w, q, k, v, valid, qpos):
  """(o [B, Qp, H, Kp], base-2 row max m [B, H, Qp], 1 / row sum [B, H, Qp])."""
  b, q_len_p, h, k_pad = q.shape
  k_len_p = k.shape[1]
  bq = st.blocks.fwd_q
  stats = jax.ShapeDtypeStruct((b, h, q_len_p), jnp.float32)
  return _pallas(
    _fwd_kernel,
    st,
    "flash_attention_fwd",
    "fwd",
    grid=(q_len_p // bq, b, h),
    in_specs=_in_specs(bq, k_len_p, k_pad, by_q=True)[:6],
    out_specs=[_seq_spec(bq, k_pad, True), _stat_spec(bq, True), _stat_spec(bq, True)],
    out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), stats, stats],
  )(hash_w, q, k, v, valid, qpos)


@functools.partial(jax.jit, static_argnums=0)
def _backward(st: _Static, res, do):
  """(dq, dk, dv) on the padded inputs from the forward's residuals."""
  hash_w, q, k, v, valid, qpos, o, m, linv = res
  b, q_len_p, h, k_pad = q.shape
  k_len_p = k.shape[1]
  # rowsum(dO * O) = rowsum(dP * P) also with dropout (O is the dropped output).
  delta = jnp.einsum("bqhk,bqhk->bhq", do.astype(jnp.float32), o.astype(jnp.float32))
  args = (hash_w, q, k, v, valid, qpos, do, m, linv, delta)

  bk, bq = st.blocks.dkv_k, q_len_p  # dK/dV: a key block, every query
  dkv_out = [_seq_spec(bk, k_pad, True)] * 2
  dkv_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
  if st.blocks.one_pass_bwd:  # and each key block's share of dQ, all queries
    n_kb = k_len_p // bk
    dkv_out.append(
      pl.BlockSpec((None, None, q_len_p, None, k_pad), lambda i, b, h: (i, b, 0, h, 0))
    )
    dkv_shape.append(jax.ShapeDtypeStruct((n_kb, *q.shape), jnp.float32))
  grads = _pallas(
    _dkv_kernel,
    st,
    "flash_attention_bwd" if st.blocks.one_pass_bwd else "flash_attention_dkv",
    "dkv",
    grid=(k_len_p // bk, b, h),
    in_specs=_in_specs(bq, bk, k_pad, by_q=False),
    out_specs=dkv_out,
    out_shape=dkv_shape,
  )(*args)
  if st.blocks.one_pass_bwd:
    dk, dv, dq_shares = grads
    return (jnp.sum(dq_shares, axis=0) * st.scale).astype(q.dtype), dk, dv
  dk, dv = grads

  bq, bk = st.blocks.dq_q, k_len_p  # dQ: a query block, every key
  dq = _pallas(
    _dq_kernel,
    st,
    "flash_attention_dq",
    "dq",
    grid=(q_len_p // bq, b, h),
    in_specs=_in_specs(bq, bk, k_pad, by_q=True),
    out_specs=_seq_spec(bq, k_pad, True),
    out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
  )(*args)
  return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st: _Static, hash_w, q, k, v, valid, qpos):
  return _forward(st, hash_w, q, k, v, valid, qpos)[0]


def _flash_fwd(st, hash_w, q, k, v, valid, qpos):
  o, m, linv = _forward(st, hash_w, q, k, v, valid, qpos)
  return o, (hash_w, q, k, v, valid, qpos, o, m, linv)


def _flash_bwd(st, res, do):
  dq, dk, dv = _backward(st, res, do)
  return None, dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------- entry point


def _pow2_at_least(n: int, low: int) -> int:
  return max(low, 1 << (n - 1).bit_length())


def _padded(length: int, *sizes: int) -> tuple[int, list[int]]:
  """The length padded to a MIN_BLOCK multiple, and each block size clipped to the largest
  power of two <= it that divides the padded length."""
  padded = _round_up(length, MIN_BLOCK)
  blocks = []
  for size in sizes:
    block = size
    while padded % block:
      block //= 2
    blocks.append(block)
  return padded, blocks


def _local_attention(
  st: _Static, seed_w, bh_offset, q_BQHK, k_BSHK, v_BSHK, input_mask_BS, positions_BQ
) -> Array:
  """One shard's attention: pads to the kernels' tiles, runs them, slices back."""
  _, q_len, _, head_dim = q_BQHK.shape
  k_len = k_BSHK.shape[1]
  k_pad = _pow2_at_least(head_dim, MIN_BLOCK)
  blocks = st.blocks
  q_len_p, (fwd_q, dkv_q, dq_q) = _padded(q_len, blocks.fwd_q, blocks.dkv_q, blocks.dq_q)
  k_len_p, (fwd_k, dkv_k, dq_k) = _padded(k_len, blocks.fwd_k, blocks.dkv_k, blocks.dq_k)
  st = dataclasses.replace(
    st,
    blocks=dataclasses.replace(
      blocks, fwd_q=fwd_q, dkv_q=dkv_q, dq_q=dq_q, fwd_k=fwd_k, dkv_k=dkv_k, dq_k=dq_k
    ),
  )

  def pad(x, length, axis):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    if x.ndim == 4:
      widths[3] = (0, k_pad - x.shape[3])
    return jnp.pad(x, widths)

  hash_w = jnp.concatenate(
    [seed_w.astype(jnp.uint32), jnp.stack([jnp.asarray(bh_offset, jnp.uint32), jnp.uint32(0)])]
  )
  o = _flash(
    st,
    hash_w,
    pad(q_BQHK, q_len_p, 1),
    pad(k_BSHK, k_len_p, 1),
    pad(v_BSHK, k_len_p, 1),
    pad(input_mask_BS.astype(jnp.int32), k_len_p, 1),
    pad(positions_BQ.astype(jnp.int32), q_len_p, 1),
  )
  return o[:, :q_len, :, :head_dim]


def _axes_dividing(axes, size: int, mesh) -> tuple[str, ...]:
  """The mesh axes of `axes` (a name, a tuple of names or None) if their product divides
  `size` and exceeds 1, else () (as sharding.fit_spec: that dimension is replicated)."""
  names = (axes,) if isinstance(axes, str) else tuple(axes or ())
  n = math.prod(mesh.shape[a] for a in names)
  return names if n > 1 and size % n == 0 else ()


def flash_attention(
  q_BQHK: Array,
  k_BSHK: Array,
  v_BSHK: Array,
  input_mask_BS: Array,
  *,
  causal: bool = False,
  query_positions_BQ: Array | None = None,
  dropout_rate: float = 0.0,
  dropout_seed: Array | None = None,
  interpret: bool = False,
  blocks: BlockSizes = DEFAULT_BLOCKS,
  batch_axes: str | Sequence[str] | None = None,
  head_axes: str | Sequence[str] | None = None,
) -> Array:
  """Softmax attention [B, Q, H, K] of queries [B, Q, H, K] over keys and values [B, S, H, K],
  equal to `attention.explicit_attention` with `attention.attention_mask(input_mask_BS, causal,
  query_positions_BQ)` and, for `dropout_rate` > 0, the probabilities dropped out where
  `dropout.keep_mask` with the seed words `dropout_seed` (`dropout.hash_seed(key)`) drops them.

  Logits, softmax statistics and accumulators are float32, the matmul operands q, k, v's
  dtype. `query_positions_BQ`: each query's position (default 0..S-1, Q = S), read only when
  causal. Under a mesh (`jax.set_mesh`), `batch_axes` / `head_axes` name the mesh axes B and H
  are split over (as the logical rules place them); the kernels then run per shard."""
  b, q_len, h, head_dim = q_BQHK.shape
  k_len = k_BSHK.shape[1]
  if k_BSHK.shape != (b, k_len, h, head_dim) or v_BSHK.shape != k_BSHK.shape:
    raise ValueError(f"q {q_BQHK.shape}, k {k_BSHK.shape}, v {v_BSHK.shape} do not match")
  if input_mask_BS.shape != (b, k_len):
    raise ValueError(f"input_mask {input_mask_BS.shape} is not [B, S] = {(b, k_len)}")
  if dropout_rate >= 1.0:  # as Dropout: everything dropped
    return jnp.zeros_like(q_BQHK)
  if dropout_rate > 0.0 and dropout_seed is None:
    raise ValueError("dropout_rate > 0 needs dropout_seed (dropout.hash_seed of a key)")
  if query_positions_BQ is None:
    if q_len != k_len:
      raise ValueError(f"Q={q_len} != S={k_len} needs query_positions_BQ")
    query_positions_BQ = jnp.broadcast_to(jnp.arange(q_len, dtype=jnp.int32), (b, q_len))
  seed_w = jnp.zeros((2,), jnp.uint32) if dropout_rate <= 0.0 else dropout_seed
  mesh = jax.sharding.get_abstract_mesh()
  batch_axes = () if mesh.empty else _axes_dividing(batch_axes, b, mesh)
  head_axes = () if mesh.empty else _axes_dividing(head_axes, h, mesh)
  st = _Static(
    q_len=q_len,
    k_len=k_len,
    heads=h,
    head_dim=head_dim,
    causal=causal,
    rate=max(float(dropout_rate), 0.0),
    blocks=blocks,
    interpret=interpret,
  )
  args = (q_BQHK, k_BSHK, v_BSHK, input_mask_BS, query_positions_BQ)
  if not (batch_axes or head_axes):
    return _local_attention(st, seed_w, 0, *args)

  def shard(seed_w, q_BQHK, *rest):
    b_local, h_local = q_BQHK.shape[0], q_BQHK.shape[2]
    b_first = lax.axis_index(batch_axes) * b_local if batch_axes else 0
    h_first = lax.axis_index(head_axes) * h_local if head_axes else 0
    return _local_attention(st, seed_w, b_first * h + h_first, q_BQHK, *rest)

  seq = PartitionSpec(batch_axes or None, None, head_axes or None, None)
  rows = PartitionSpec(batch_axes or None, None)
  return jax.shard_map(
    shard,
    in_specs=(PartitionSpec(), seq, seq, seq, rows, rows),
    out_specs=seq,
    check_vma=False,
  )(seed_w, *args)
