"""What each backend runs: the choices behind BertConfig's `kernels`, `dropout_rng` and
`attention_impl`, and the measurements that set their 'auto' values per platform.

model.py writes the layers once; they ask here which array ops (`ops_for`: stock XLA ops or the
XLA:CPU kernels of kernels.py), which dropout keep-masks (`KEEP_MASKS`) and which attention
(`attention_choice`) to run. An 'auto' value moves to another choice on a platform only after a
measurement there says it pays (the comments on `DROPOUT_RNG_AUTO` and `AUTO_ATTENTION`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import kernels
from bert_jax.model_config import BertConfig

Array = jax.Array

# ----------------------------------------------------------------------------- 'auto' per platform

# dropout_rng='auto' per platform, each from a measurement on that platform:
# - cpu: 'hash'. tools/probes/lockstep_ab.py --size=tiny --layers=0 --rounds=12 --turn_s=3 (bf16,
#   seq 128, batch 32), step time over hash's: rbg 1.125, threefry 1.047 (medians).
# - tpu: 'hash'. bert_jax.aot, BERT-Base (scanned layers) bf16, 256 x 128 on v5e-16, mesh
#   (1,16,1): temporaries per device threefry 1.81, hash 1.81, rbg 1.92 GiB (XLA's
#   RngBitGenerator partitioning makes every device generate the global batch's mask);
#   XLA-counted FLOPs threefry 7.41e10, hash 7.23e10 (rbg 7.18e10: its bits count as none).
# - gpu: 'hash'. H200, 2026-11-28 (docs/gpu.md): with attention_impl='flash' (which draws the
#   hash mask in its kernels) Base 128 x 256 ran 1.12x torch.compile, against 0.93x for
#   threefry + explicit; hash alone 0.99x.
DROPOUT_RNG_AUTO = {"cpu": "hash", "tpu": "hash", "gpu": "hash"}

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
# - gpu: H200, 2026-11-28 (docs/gpu.md), Base 128 x 256 against torch.compile in the same call:
#     with attention dropout 0.1, flash (with dropout_rng='hash') 1.12x, explicit 0.93x;
#     without attention dropout, cudnn 1.13x (4,383 against 3,886 seq/s).
#   Where the choice cannot run, `attention_choice` falls back: flash to explicit (the same
#   hash mask), cudnn to xla.
AUTO_ATTENTION: dict[tuple[str, int], tuple[str, str]] = {
  ("cpu", 128): ("explicit_lowp", "explicit"),
  ("cpu", 512): ("explicit_lowp", "explicit"),
  ("tpu", 128): ("explicit_lowp", "explicit_lowp"),
  ("tpu", 512): ("explicit_lowp", "explicit_lowp"),
  ("gpu", 128): ("cudnn", "flash"),
}
DEFAULT_ATTENTION = ("xla", "explicit")

# attention_impl='flash' (flash_attention.py's Pallas kernels) per platform: whether Pallas
# interprets them. On a GPU they lower through Triton; on the CPU the interpreter runs them
# (slowly: for tests); no TPU (Mosaic) version.
FLASH_INTERPRET = {"gpu": False, "cpu": True}
# The largest head dim 'auto' runs the flash kernels at: their tiles hold [block, head dim]
# rows in registers, and only head dim 64 (Base, Large) has run on a GPU. A larger head (the
# Table 6 row L6_H768_A3 has 256) runs the explicit attention until a GPU measures it.
FLASH_MAX_HEAD_DIM = 128
# The oldest CUDA compute capability 'auto' runs the flash kernels on: Triton's bf16 dots need
# Ampere (8.0); they ran on Hopper (9.0).
FLASH_MIN_CAPABILITY = 8.0
# cuDNN's fused attention (jax.nn.dot_product_attention) needs Ampere or newer.
CUDNN_MIN_CAPABILITY = 8.0


# The tied MLM decoder's vocabulary rows are padded (inside the step, with zero rows whose
# logits are sliced off) to a multiple of this per platform. GPU: the H200 profile of Base
# (2026-11-28) ran the 30,522-row product as a TF32 `align1` cutlass kernel, 1.9 ms in one
# call at 12.5% occupancy; NVIDIA's BERT pads to 30,528.
VOCAB_MULTIPLE = {"gpu": 128}


def vocab_rows(cfg: BertConfig, vocab: int) -> int:
  """The rows the tied decoder's product runs on for a `vocab`-row table: `vocab` rounded up
  to cfg's platform's VOCAB_MULTIPLE (1 where none is given)."""
  multiple = VOCAB_MULTIPLE.get(resolved(cfg).platform, 1)
  return -(-vocab // multiple) * multiple


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


def _local_gpu():
  """This process's first GPU device, or None (no GPU: e.g. a program lowered for a GPU from a
  CPU host)."""
  return jax.devices()[0] if jax.default_backend() == "gpu" else None


def _cuda_short_of(minimum: float) -> str | None:
  """Why this process's GPU is not a CUDA device of compute capability >= `minimum`, or None
  (also None without a GPU)."""
  device = _local_gpu()
  if device is None:
    return None
  capability = getattr(device, "compute_capability", None)
  try:
    fits = float(capability) >= minimum
  except (TypeError, ValueError):
    fits = False
  if fits:
    return None
  return (
    f"needs a CUDA GPU of compute capability >= {minimum}, not {device.device_kind} ({capability})"
  )


def flash_unavailable(cfg: BertConfig) -> str | None:
  """Why 'auto' does not run attention_impl='flash' for `cfg` (its platform has no flash
  kernels, the head dim is beyond FLASH_MAX_HEAD_DIM, dropout_rng is not the 'hash' mask the
  kernels draw, or this process's GPU is not a CUDA device of compute capability >=
  FLASH_MIN_CAPABILITY), or None. (Without a GPU in the process, e.g. lowering for one from a
  CPU host, the Triton lowering applies.)"""
  cfg = resolved(cfg)
  if cfg.platform not in FLASH_INTERPRET:
    return f"no flash kernels for {cfg.platform}"
  if cfg.head_dim > FLASH_MAX_HEAD_DIM:
    return f"flash is not run at head dim {cfg.head_dim} > {FLASH_MAX_HEAD_DIM}"
  if cfg.dropout_rng != "hash":
    return f"flash draws the hash mask, dropout_rng is {cfg.dropout_rng}"
  short = _cuda_short_of(FLASH_MIN_CAPABILITY) if cfg.platform == "gpu" else None
  return f"flash {short}" if short else None


def cudnn_unavailable(cfg: BertConfig) -> str | None:
  """Why attention_impl='cudnn' cannot run for `cfg`: float32 (cuDNN's fused attention has no
  float32 kernels), a head dim it does not take (a multiple of 8 up to 128), or no CUDA GPU of
  compute capability >= CUDNN_MIN_CAPABILITY in this process (jax traces it only there); or
  None."""
  if cfg.compute_dtype == jnp.float32:
    return "cuDNN's fused attention has no float32 kernels"
  if cfg.head_dim > 128 or cfg.head_dim % 8:
    return f"cuDNN's fused attention does not take head dim {cfg.head_dim}"
  if _local_gpu() is None:
    return "cuDNN's fused attention is traced only in a process with a CUDA GPU"
  short = _cuda_short_of(CUDNN_MIN_CAPABILITY)
  return f"cuDNN's fused attention {short}" if short else None


def attention_plan(cfg: BertConfig, key_length: int, dropout: bool, probs: bool) -> tuple[str, str]:
  """(the attention implementation a layer runs, why, '' if it is the choice itself):
  `cfg.attention_impl`, or for 'auto' the measured `AUTO_ATTENTION` entry of cfg's platform
  nearest to `key_length` (by whether attention dropout is active), falling back to 'explicit'
  where 'flash' cannot run (`flash_unavailable`). Probabilities asked for always take
  'explicit'; 'cudnn' where it cannot run (`cudnn_unavailable`) 'xla'."""
  if probs:
    return "explicit", "attention probabilities asked for"
  impl, why = cfg.attention_impl, ""
  if impl == "auto":
    platform = resolved(cfg).platform
    lengths = [s for p, s in AUTO_ATTENTION if p == platform]
    if lengths:
      nearest = min(lengths, key=lambda s: (abs(s - key_length), s))
      choice = AUTO_ATTENTION[(platform, nearest)]
    else:
      choice = DEFAULT_ATTENTION
    impl = choice[1] if dropout else choice[0]
    if impl == "flash":
      why = flash_unavailable(cfg) or ""
      impl = "explicit" if why else impl
  if impl == "cudnn":
    why = cudnn_unavailable(cfg) or why
    impl = "xla" if why else impl
  return impl, why


def attention_choice(cfg: BertConfig, key_length: int, dropout: bool, probs: bool) -> str:
  """The attention implementation a layer runs (`attention_plan`'s)."""
  return attention_plan(cfg, key_length, dropout, probs)[0]


def attention_line(cfg: BertConfig, key_length: int, dropout: bool, probs: bool) -> str:
  """One line for the log: which attention the layers run, with which dropout, and why not
  the configured choice where it falls back."""
  impl, why = attention_plan(cfg, key_length, dropout, probs)
  rng = resolved(cfg).dropout_rng
  drop = "no attention dropout"
  if dropout:
    drop = "attention dropout from the hash mask" if impl == "flash" else f"{rng} dropout"
  line = (
    f"attention: {impl} (attention_impl={cfg.attention_impl}, {resolved(cfg).platform}, "
    f"key length {key_length}, head dim {cfg.head_dim}, {cfg.dtype}), {drop}"
  )
  return f"{line}; {why}" if why else line


def flash_interpret(cfg: BertConfig) -> bool:
  """Whether attention_impl='flash' runs in Pallas' interpreter on cfg's platform (a platform
  without the kernels is a ValueError)."""
  platform = resolved(cfg).platform
  if platform not in FLASH_INTERPRET:
    raise ValueError(
      f"attention_impl='flash' runs on GPUs (Triton) and, interpreted, on CPUs; not on {platform}"
    )
  return FLASH_INTERPRET[platform]


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


# ----------------------------------------------------------------------------- dropout masks

# dropout_rng -> (key, shape, rate) -> boolean keep-mask, True with probability 1 - rate.
KEEP_MASKS: dict[str, Callable[[Array, tuple[int, ...], float], Array]] = {
  "threefry": lambda key, shape, rate: jax.random.bernoulli(key, 1.0 - rate, shape),
  "hash": kernels.keep_mask,
}
