"""bert_jax.benchmark.host: glibc's malloc on transparent huge pages for every benchmarked process
(the caller's tunables kept, fewer page faults) and bf16 timed only where the CPU has it."""

import os
import subprocess
import sys

import pytest

from bert_jax.benchmark import (
  host,
  lockstep,
  peers,
)


def test_thp_malloc_env_keeps_the_callers_tunables(monkeypatch):
  monkeypatch.setattr(host, "thp_available", lambda: True)
  assert host.with_thp_malloc({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": host.THP_TUNABLE}
  got = host.with_thp_malloc({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
  assert got["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + host.THP_TUNABLE
  mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
  assert host.with_thp_malloc(mine) == mine
  monkeypatch.setattr(host, "thp_available", lambda: False)
  assert host.with_thp_malloc({"A": "1"}) == {"A": "1"}


_FAULTS_CHILD = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):  # 64 MB blocks: malloc maps each afresh (numpy would madvise by itself)
  p = libc.malloc(64 << 20)
  ctypes.memset(p, 1, 64 << 20)
  libc.free(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_thp_malloc_env_cuts_page_faults():
  """The tunable takes effect: 8 fresh 64 MB blocks fault 4 KB pages in, or 2 MB ones."""
  if not host.thp_available():
    pytest.skip("the kernel offers no transparent huge pages")
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}

  def faults(e):
    out = subprocess.run([sys.executable, "-c", _FAULTS_CHILD], env=e, capture_output=True)
    return int(out.stdout)

  libc, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
  if libc != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
    pytest.skip(f"{host.THP_TUNABLE} needs glibc >= 2.35, not {libc} {version}")
  plain, thp = faults(env), faults(host.with_thp_malloc(env))
  assert plain > 8 * 16_000  # 64 MB is 16,384 pages of 4 KB
  assert thp < plain / 20  # 2 MB pages, bar the unaligned ends of each block


def test_bf16_is_timed_only_where_the_cpu_has_it(monkeypatch):
  """Without --dtypes, our dtypes and the peers follow the CPU; --lockstep times bf16 where
  the CPU has bf16 instructions (our faster mode there), float32 elsewhere; --dtypes wins."""
  monkeypatch.setattr(host, "cpu_has_bf16", lambda: True)
  assert host.default_dtypes() == ["float32", "bfloat16"]
  assert peers.default_peers() == list(peers.PEERS_FP32 + peers.PEERS_BF16)
  assert lockstep.lockstep_dtype(None) == "bfloat16"
  assert lockstep.lockstep_dtype(["float32", "bfloat16"]) == "float32"
  monkeypatch.setattr(host, "cpu_has_bf16", lambda: False)
  assert host.default_dtypes() == ["float32"]
  assert peers.default_peers() == list(peers.PEERS_FP32)
  assert lockstep.lockstep_dtype(None) == "float32"
  assert lockstep.lockstep_dtype([]) == "float32"
