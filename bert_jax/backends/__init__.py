"""Every per-platform speed choice of the model: what BertConfig's `kernels`, `dropout_rng`
and `attention_impl` resolve to on each platform for 'auto' (their values:
`model_config.KERNELS`, ...), and the array ops, tied-decoder padding and attention plan that
follow. The model asks here and never
branches on a platform itself. The measurement behind each 'auto' entry: docs/gpu.md ("Model
paths and why each stays") and docs/backends.md (CPU and TPU).

Modules: `attention` (`attend`, the one attention dispatch), `dropout` (keep-masks and the
Dropout module), `cpu` (the XLA:CPU kernels), `flash` (Pallas flash attention), `fused_norm`
(post-LN's dropout + residual + LayerNorm in Pallas: kernels='fused', the GPU's 'auto').
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.backends import cpu

if TYPE_CHECKING:  # model_config imports the values above from here
  from bert_jax.model_config import BertConfig

Array = jax.Array

# ----------------------------------------------------------------------------- 'auto' per platform

# kernels='auto' per platform (docs/gpu.md, docs/backends.md); a platform not named: 'xla'.
KERNELS_AUTO = {"cpu": "cpu", "gpu": "fused"}
# The oldest CUDA compute capability 'auto' runs the fused kernels on (Triton's, as flash's).
FUSED_MIN_CAPABILITY = 8.0
# dropout_rng='auto' per platform (docs/gpu.md, docs/backends.md).
DROPOUT_RNG_AUTO = {"cpu": "hash", "tpu": "hash", "gpu": "hash"}

# attention_impl='auto' per (platform, key length S): (without attention dropout, with it); a
# length takes the nearest measured one (docs/gpu.md, docs/backends.md).
AUTO_ATTENTION: dict[tuple[str, int], tuple[str, str]] = {
  ("cpu", 128): ("explicit_lowp", "explicit"),
  ("cpu", 512): ("explicit_lowp", "explicit"),
  ("tpu", 128): ("explicit_lowp", "explicit_lowp"),
  ("tpu", 512): ("explicit_lowp", "explicit_lowp"),
  ("gpu", 128): ("cudnn", "flash"),
}
# A platform without a measured entry (before attention_impl existed).
DEFAULT_ATTENTION = ("xla", "explicit")

# Dense bf16 peak FLOP/s per chip, from the datasheets, by device kind: a substring of the kind
# JAX or PyTorch reports, the first match wins (so "H100 PCIe" before "H100"). The one table of
# peaks: the trainer's `mfu` (metrics.jsonl) and the benchmark's `mfu_datasheet` divide by it.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
  ("TPU v4", 275e12),
  ("TPU v5 lite", 197e12),
  ("TPU v5e", 197e12),
  ("TPU v5p", 459e12),
  ("TPU v5", 459e12),
  ("TPU v6 lite", 918e12),
  ("TPU v6e", 918e12),
  ("H200", 989e12),
  ("H100 PCIe", 756e12),
  ("H100", 989e12),  # SXM
  ("A100", 312e12),
)


def peak_flops(device_kind: str) -> float | None:
  """The datasheet's dense bf16 peak FLOP/s of one chip of `device_kind`, or None (unknown: on
  a CPU, config.log.peak_flops gives it)."""
  kind = device_kind.lower()
  return next((flops for key, flops in PEAK_BF16_FLOPS if key.lower() in kind), None)


# Whether Pallas interprets the flash kernels, per platform (GPU: Triton; CPU: for tests).
FLASH_INTERPRET = {"gpu": False, "cpu": True}
# The largest head dim 'auto' runs flash at (only 64 has run on a GPU: docs/gpu.md).
FLASH_MAX_HEAD_DIM = 128
# The oldest CUDA compute capability 'auto' runs flash on (Triton's bf16 dots: Ampere).
FLASH_MIN_CAPABILITY = 8.0
# The oldest CUDA compute capability cuDNN's fused attention runs on.
CUDNN_MIN_CAPABILITY = 8.0

# The tied decoder's rows padded inside the step to a multiple of this (docs/gpu.md).
VOCAB_MULTIPLE = {"gpu": 128}


def platform_family(platform: str) -> str:
  """A JAX platform name as DROPOUT_RNG_AUTO and AUTO_ATTENTION key it ('cuda', 'rocm' -> 'gpu')."""
  return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


def vocab_rows(cfg: BertConfig, vocab: int) -> int:
  """The rows the tied decoder's product runs on for a `vocab`-row table: `vocab` rounded up
  to cfg's platform's VOCAB_MULTIPLE (1 where none is given)."""
  multiple = VOCAB_MULTIPLE.get(resolved(cfg).platform, 1)
  return -(-vocab // multiple) * multiple


def resolve_kernels(cfg: BertConfig, platform: str) -> BertConfig:
  """`cfg` resolved for a JAX platform ('cpu', 'tpu', 'gpu', 'cuda', ...): `kernels` 'auto'
  becomes the platform's `KERNELS_AUTO` ('xla' where none is named, and where the GPU's 'fused'
  does not apply: ROCm, a dropout_rng other than the 'hash' mask its kernels draw, or this
  process's GPU not a CUDA device of compute capability >= FUSED_MIN_CAPABILITY),
  `dropout_rng` 'auto' the platform's `DROPOUT_RNG_AUTO`, and `platform` records it for
  `attention_impl` 'auto' (which also depends on the sequence length: `attention_choice`).
  Explicit values stay."""
  family = platform_family(platform)
  rng = cfg.dropout_rng if cfg.dropout_rng != "auto" else DROPOUT_RNG_AUTO.get(family, "threefry")
  kernels = cfg.kernels
  if kernels == "auto":
    kernels = KERNELS_AUTO.get(family, "xla")
    # The fused kernels draw the hash mask: another generator asked for keeps XLA's ops.
    cannot = platform == "rocm" or rng != "hash" or _cuda_short_of(FUSED_MIN_CAPABILITY)
    kernels = "xla" if kernels == "fused" and cannot else kernels
  return dataclasses.replace(cfg, kernels=kernels, dropout_rng=rng, platform=family)


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
  matmul=cpu.matmul,
  add_bias=cpu.add_bias,
  logits=cpu.tied_logits,
  scores=cpu.attention_scores,
  context=cpu.attention_context,
  layer_norm=cpu.LayerNorm,
)


def ops_for(cfg: BertConfig) -> Ops:
  """The one place `BertConfig.kernels` acts on the array ops (an unresolved 'auto' resolves
  for the default backend of the process); 'fused' runs XLA's and, for post-LN's residual,
  `fused_norm`'s kernels."""
  return CPU_OPS if resolved(cfg).kernels == "cpu" else XLA_OPS


def decoder_logits(cfg: BertConfig, h_BPD: Array, table_VD: Array) -> Array:
  """float32 logits [B, P, V] of h against a vocabulary table (the tied MLM decoder). The
  product runs on the table padded with zero rows to `vocab_rows` (on a GPU a multiple of 128,
  the dots' aligned tiles); the padded columns are sliced off before anything reads them, so
  none takes probability or wins an argmax, and the parameters keep V rows."""
  vocab = table_VD.shape[0]
  rows = vocab_rows(cfg, vocab)
  if rows != vocab:
    table_VD = jnp.pad(table_VD, ((0, rows - vocab), (0, 0)))
  return ops_for(cfg).logits(h_BPD, table_VD, cfg.compute_dtype)[..., :vocab]
