"""The host under the benchmark: CPU features, glibc's huge-page malloc tunable, /proc readings
(page faults, peak RSS, load) and the matmul peak that MFU divides by.

Imports only the standard library at module level: the peer worker (`peer_worker.py`) runs in
an interpreter without bert_jax and loads this file by path.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from typing import Any

# glibc's malloc tunable that backs its blocks with transparent huge pages. XLA:CPU and PyTorch
# allocate a step's activations afresh each step; with 4 KB pages a BERT-Base step (batch
# 32 x 128) takes ~1.3M page faults and several seconds of kernel time, with 2 MB pages a few
# thousand. Read by glibc >= 2.35 at process start, ignored by older ones.
THP_TUNABLE = "glibc.malloc.hugetlb=1"
# What this process's glibc read at start (the benchmark sets GLIBC_TUNABLES for its children).
STARTED_WITH_TUNABLES = os.environ.get("GLIBC_TUNABLES", "")


def read_text(path: str) -> str:
  """A (Linux /proc or /sys) file's text; "" where it cannot be read."""
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ""


def cpu_has_bf16() -> bool:
  """config_lib.cpu_has_bf16 (imported when asked: the peer worker never asks)."""
  from bert_jax import config_lib

  return config_lib.cpu_has_bf16()


def default_dtypes() -> list[str]:
  """Our compute dtypes: bf16 too only where the CPU runs it natively (elsewhere it is
  emulated and far slower than fp32)."""
  return ["float32", "bfloat16"] if cpu_has_bf16() else ["float32"]


def thp_available() -> bool:
  """Whether the kernel offers transparent huge pages to processes that ask (Linux)."""
  mode = read_text("/sys/kernel/mm/transparent_hugepage/enabled")
  return "[always]" in mode or "[madvise]" in mode


def with_thp_malloc(env: dict[str, str]) -> dict[str, str]:
  """`env` with THP_TUNABLE added to GLIBC_TUNABLES, unless the kernel has no THP or the
  caller already set hugetlb."""
  tunables = env.get("GLIBC_TUNABLES", "")
  if not thp_available() or "glibc.malloc.hugetlb" in tunables:
    return env
  return {**env, "GLIBC_TUNABLES": f"{tunables}:{THP_TUNABLE}" if tunables else THP_TUNABLE}


def minor_faults() -> int:
  """Minor page faults of this process so far."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_rss_gb() -> float:
  """This process's peak resident set (VmHWM), in GB."""
  for line in read_text("/proc/self/status").splitlines():
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) * 1024 / 1e9
  return float("nan")


def load_average() -> float:
  """The host's 1-minute load average."""
  return os.getloadavg()[0]


def host_record() -> dict[str, Any]:
  """What the results depend on besides the code: CPU, its bf16 support, load, tunables."""
  return {
    "kind": "host",
    "child_glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    "machine": os.uname().machine,
    "cpus": os.cpu_count(),
    "cpu_bf16": cpu_has_bf16(),
    "load_avg": load_average(),
  }


def time_calls(fn: Callable[[], Any], reps: int, warmup: int = 1) -> list[float]:
  """Seconds of each of `reps` calls of `fn` (which must block until its result is ready),
  after `warmup` untimed ones."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return times


def per_step_reps(run_n: Callable[[int], Any], steps: int, reps: int) -> list[float]:
  """Seconds per step of each of `reps` back-to-back runs of `steps` steps (`run_n(steps)` must
  wait for its last step only): an accelerator's steps queue up as they do in training."""
  out = []
  for _ in range(reps):
    t0 = time.perf_counter()
    run_n(steps)
    out.append((time.perf_counter() - t0) / steps)
  return out


def matmul_peak_gflops(dtype: str, n: int = 2048, reps: int = 7) -> float:
  """Best GFLOP/s over `reps` n x n x n matmuls in `dtype` (bf16 operands accumulate in f32,
  as the model's matmuls do), measured in this process. The best, not the median: a peak is
  what the machine can do, and on a shared host a median dips with the neighbours' load."""
  import jax
  import jax.numpy as jnp

  x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
  times = time_calls(lambda: jax.block_until_ready(f(x)), reps)
  return 2 * n**3 / min(times) / 1e9
