"""A bf16 x bf16 -> f32 GEMM for AVX512-BF16 CPUs, called from JAX through the XLA FFI.

The C++ source (bf16_gemm.cc, next to this file) is compiled with g++ on first use into a cache
directory keyed by a hash of the source, the compiler flags, the compiler and the jax version, then
loaded with ctypes and registered as an FFI target for the CPU platform.

  from bert_jax.kernels import cpu_gemm
  if cpu_gemm.available():
    c = cpu_gemm.bf16_matmul(a, b, b_transposed=False)   # a [M,K] bf16, b [K,N] bf16 -> [M,N] f32
    c = cpu_gemm.bf16_matmul(a, bt, b_transposed=True)   # bt [N,K] bf16 -> a @ bt.T
    c = cpu_gemm.bf16_matmul(x, g, a_transposed=True)    # x [K,M] bf16 -> x.T @ g (e.g. dW)

Nothing here raises at import; `available()` says whether the kernel can be used and
`unavailable_reason()` why not.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

SOURCE = pathlib.Path(__file__).with_name("bf16_gemm.cc")
TARGET_NAME = "bert_jax_bf16_gemm"
BASE_FLAGS = (
  "-O3",
  "-std=c++17",
  "-fPIC",
  "-shared",
  "-mavx512f",
  "-mavx512bw",
  "-mavx512vl",
  "-mavx512bf16",
  "-mfma",
  "-pthread",
)

_lock = threading.Lock()
_state: dict = {}  # "ok": bool, "reason": str, "lib": CDLL, "path": str, "compile_seconds": float


def _cache_dir() -> pathlib.Path:
  root = os.environ.get("BERT_JAX_KERNEL_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "bert_jax", "kernels"
  )
  return pathlib.Path(root)


def _cpu_has_avx512_bf16() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          flags = line.split(":", 1)[1].split()
          return all(x in flags for x in ("avx512f", "avx512bw", "avx512_bf16"))
  except OSError:
    return False
  return False


def _compiler() -> str | None:
  cxx = os.environ.get("CXX") or "g++"
  return shutil.which(cxx)


def build(defines: dict | None = None, cache_dir: pathlib.Path | None = None, force: bool = False):
  """Compiles bf16_gemm.cc (if not cached) and returns (path to .so, seconds spent compiling).

  Raises RuntimeError on failure. `defines` (e.g. {"BG_MR": 8}) are for tuning experiments.
  """
  cxx = _compiler()
  if cxx is None:
    raise RuntimeError("no C++ compiler (g++) on PATH")
  flags = list(BASE_FLAGS) + [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
  include = jax.ffi.include_dir()
  src = SOURCE.read_bytes()
  try:
    cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError) as e:
    raise RuntimeError(f"cannot run {cxx}: {e}") from e
  key = hashlib.sha256()
  for part in (src, " ".join(flags).encode(), include.encode(), jax.__version__.encode(), cxx_version.encode()):
    key.update(part)
    key.update(b"\0")
  out_dir = cache_dir or _cache_dir()
  out = out_dir / f"bf16_gemm_{key.hexdigest()[:20]}.so"
  if out.exists() and not force:
    return out, 0.0
  out_dir.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=out_dir)
  os.close(fd)
  cmd = [cxx, *flags, "-I", include, str(SOURCE), "-o", tmp]
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
      raise RuntimeError(f"compiling {SOURCE.name} failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    os.replace(tmp, out)  # atomic: concurrent builders each write their own temp file
  except subprocess.SubprocessError as e:
    raise RuntimeError(f"compiling {SOURCE.name} failed: {e}") from e
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return out, time.perf_counter() - t0


def _load() -> dict:
  with _lock:
    if _state:
      return _state
    try:
      if os.environ.get("BERT_JAX_DISABLE_CPU_GEMM"):
        raise RuntimeError("disabled by BERT_JAX_DISABLE_CPU_GEMM")
      if not _cpu_has_avx512_bf16():
        raise RuntimeError("CPU lacks avx512f/avx512bw/avx512_bf16 (per /proc/cpuinfo)")
      path, secs = build()
      lib = ctypes.CDLL(str(path))
      jax.ffi.register_ffi_target(TARGET_NAME, jax.ffi.pycapsule(lib.BertJaxBf16Gemm), platform="cpu")
      _state.update(ok=True, reason="", lib=lib, path=str(path), compile_seconds=secs)
    except Exception as e:  # noqa: BLE001 -- never raise at import/availability check
      _state.update(ok=False, reason=f"{type(e).__name__}: {e}", lib=None, path=None, compile_seconds=0.0)
    return _state


def available() -> bool:
  """True when the kernel compiled, loaded and registered (compiles on the first call)."""
  return bool(_load()["ok"])


def unavailable_reason() -> str:
  """Why `available()` is False ('' when it is True)."""
  return _load()["reason"]


def library_path() -> str | None:
  return _load()["path"]


def bf16_matmul(a, b, b_transposed: bool = False, *, a_transposed: bool = False, num_threads: int = 0):
  """f32 result of op(a) @ op(b) for 2-D bfloat16 operands, f32 accumulation.

  op(a) = a.T if a_transposed else a   (a is [M,K], or [K,M] when a_transposed)
  op(b) = b.T if b_transposed else b   (b is [K,N], or [N,K] when b_transposed)
  Works under jax.jit (CPU backend only); not differentiable (no VJP is defined).
  num_threads=0 uses all hardware threads (or the BERT_JAX_GEMM_THREADS environment variable).
  """
  st = _load()
  if not st["ok"]:
    raise RuntimeError(f"bf16 CPU GEMM unavailable: {st['reason']}")
  a = jnp.asarray(a)
  b = jnp.asarray(b)
  if a.ndim != 2 or b.ndim != 2:
    raise ValueError(f"bf16_matmul wants 2-D operands, got {a.shape} and {b.shape}")
  if a.dtype != jnp.bfloat16 or b.dtype != jnp.bfloat16:
    raise ValueError(f"bf16_matmul wants bfloat16 operands, got {a.dtype} and {b.dtype}")
  m, k = (a.shape[1], a.shape[0]) if a_transposed else a.shape
  n, kb = (b.shape[0], b.shape[1]) if b_transposed else (b.shape[1], b.shape[0])
  if k != kb:
    raise ValueError(
      f"contraction sizes differ: a {a.shape}, b {b.shape}, a_transposed={a_transposed}, b_transposed={b_transposed}"
    )
  call = jax.ffi.ffi_call(TARGET_NAME, jax.ShapeDtypeStruct((m, n), jnp.float32))
  return call(
    a, b, a_trans=np.int32(bool(a_transposed)), b_trans=np.int32(bool(b_transposed)), num_threads=np.int32(num_threads)
  )
