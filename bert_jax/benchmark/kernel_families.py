"""Device time by kernel family, from kernel names alone: the one classifier that reads our
step's trace (XLA's kernels) and torch.compile's (Inductor's Triton kernels, ATen's, cuBLAS's),
so the two profiles of the GPU comparison (`gpu.py`) line up family by family.

Families, first match wins: attention (fused attention kernels: our Pallas flash kernels,
cuDNN's and PyTorch's SDPA), GEMM (cuBLAS/cuBLASLt, CUTLASS, XLA's Triton GEMM fusions,
Inductor's GEMM templates, cuBLAS's split-K reductions), optimizer (PyTorch's fused AdamW and
foreach kernels, clipping's norms), RNG/compare (random bits and the compares that make
dropout's keep masks: threefry's and the counter hash's xor/shift fusions, Philox, PyTorch's
dropout kernels, XLA's compare fusions), transpose (XLA's transpose fusions, Inductor's
`clone`/permute copies), reduce (reduce fusions, Inductor's reductions, softmax and norm
kernels), elementwise (XLA's loop fusions, Inductor's pointwise kernels, ATen's elementwise
kernels, converts), copy (memcpy, memset, concatenation), other (scatter, sort, and what no
rule names). A name is matched
as a list of words (split at every character that is not a letter or digit), so `xor` in
`loop_add_xor_fusion` matches and `rand` inside `operand` does not.

XLA names a generic fusion `fusion_N`; where the caller knows the HLO instruction behind it
(`profile.py` does), it passes the instruction's opcodes as `context`, read only when the name
alone says nothing. PyTorch's names say what they are, so its kernels need no context.

Standard library only: the PyTorch worker (`peer_worker.py`, run by path without bert_jax)
loads this file as a sibling.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

FAMILIES = (
  "attention",
  "gemm",
  "optimizer",
  "rng_compare",
  "transpose",
  "reduce",
  "elementwise",
  "copy",
  "other",
)
TITLES = {
  "attention": "attention (fused kernels)",
  "gemm": "GEMM",
  "optimizer": "optimizer",
  "rng_compare": "RNG / compare (dropout masks)",
  "transpose": "transpose",
  "reduce": "reduce",
  "copy": "copy / memset",
  "elementwise": "elementwise",
  "other": "other",
}
# (family, words, word prefixes, substrings), each a space-separated list: a name is in the
# family when one of its words (`words`) is among the words or starts with one of the
# prefixes, or its lower-cased text contains one of the substrings (for names that glue words
# together: `s16816gemm`).
RULES = (
  ("attention", "sdpa mha attention", "fmha flash", ""),
  ("gemm", "mm bmm addmm matmul dot convolution cublas cublaslt cutlass xmma wgmma",
   "nvjet splitkreduce", "gemm"),
  ("optimizer", "adam adamw foreach", "fusedadam lpnorm", "multi_tensor_apply"),
  ("rng_compare", "compare xor shift threefry philox rng random rand randn bernoulli dropout",
   "philox", ""),
  ("transpose", "transpose permute clone", "", ""),
  ("reduce", "reduce reduction per red norm sum mean amax", "softmax layernorm", ""),
  # XLA's loop fusions and Inductor's pointwise kernels before copies: a `loop_slice_fusion`
  # or a `triton_poi_fused__to_copy` computes each element as it moves it.
  ("elementwise", "loop poi convert fill add subtract multiply divide select maximum minimum "
   "negate exponential rsqrt sqrt tanh erf log power and or not abs clamp mul div sub neg exp "
   "gelu where",
   "elementwise unrolled", ""),
  ("copy", "memcpy memset copy concatenate slice pad cat", "memcpy memset", ""),
)  # fmt: skip
_RULES = [(f, frozenset(w.split()), tuple(p.split()), tuple(s.split())) for f, w, p, s in RULES]
# XLA's generic fusion names (no opcode in them; XLA:CPU's YNNPACK fusions): read the caller's
# context instead.
GENERIC = re.compile(r"^(fusion|wrapped_fusion|command_buffer|[xy]nn_fusion)([._]\d+)?$")


def words(name: str) -> list[str]:
  """A kernel name's words, lower case: split at anything not a letter or a digit."""
  return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def _match(text: str) -> str | None:
  ws = words(text)
  low = text.lower()
  for family, exact, prefixes, subs in _RULES:
    if any(w in exact or w.startswith(prefixes) for w in ws) or any(x in low for x in subs):
      return family
  return None


def classify(name: str, context: str = "") -> str:
  """A kernel's family from its name (`RULES`, first match), else, for XLA's generic fusion
  names only, from `context` (the opcodes of its HLO instruction), else "other"."""
  base = re.sub(r"^void\s+", "", name.strip())
  got = _match(context) if GENERIC.match(base) else _match(base)
  return got or "other"


def summarize(
  kernels: Iterable[tuple[str, float, float, float]],
  steps: int,
  contexts: dict[str, str] | None = None,
  top: int = 12,
) -> dict[str, Any]:
  """Per-step ms by family and the top kernels, from (name, start µs, duration µs, end µs)
  tuples; `contexts` maps a kernel name to its `classify` context."""
  contexts = contexts or {}
  fam = dict.fromkeys(FAMILIES, 0.0)
  by_name: dict[str, dict[str, Any]] = {}
  starts, ends = [], []
  for name, start, dur, end in kernels:
    k = by_name.get(name)
    if k is None:
      k = by_name[name] = {"kernel": name, "family": classify(name, contexts.get(name, "")),
                           "calls": 0, "us": 0.0}  # fmt: skip
    k["calls"] += 1
    k["us"] += dur
    fam[k["family"]] += dur
    starts.append(start)
    ends.append(end)
  total = sum(fam.values())
  ranked = sorted(by_name.values(), key=lambda k: -k["us"])[:top]
  return {
    "steps": steps,
    "device_ms": total / steps / 1e3,
    "span_ms": (max(ends) - min(starts)) / steps / 1e3 if starts else 0.0,
    "families_ms": {f: us / steps / 1e3 for f, us in fam.items()},
    "kernels": len(by_name),
    "top": [
      {
        "kernel": k["kernel"],
        "family": k["family"],
        "calls": k["calls"] / steps,
        "ms": k["us"] / steps / 1e3,
      }
      for k in ranked
    ],  # fmt: skip
  }


# ----------------------------------------------------------------------------- Chrome traces

# The event categories of a device's work in PyTorch's Chrome trace (torch.profiler).
TORCH_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# Threads of an XProf (jax.profiler) device process that repeat its kernels.
DERIVED_THREADS = {
  "XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Framework Ops", "Framework Name Scope",
  "Source code", "Launch Stats", "Async XLA Ops",
}  # fmt: skip


def read_trace(path: str) -> dict[str, Any]:
  """A Chrome trace file (JSON, gzipped or not)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    return json.load(f)


def device_kernels(trace: dict[str, Any]) -> list[tuple[str, float, float, float]]:
  """The device's kernels of a Chrome trace as (name, start µs, duration µs, end µs): events of
  PyTorch's device categories (torch.profiler), else the complete events of the processes named
  `/device:GPU:N` bar XProf's derived threads (jax.profiler). A trace with neither (a CPU run)
  gives its CPU ops (`cpu_op`, PyTorch) with their own time: the nested ops' time taken out."""
  events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
  torch_dev = [e for e in events if e.get("cat") in TORCH_DEVICE_CATS]
  if torch_dev:
    return [_tuple(e) for e in torch_dev]
  meta = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "M"]
  devices = {e["pid"] for e in meta if e.get("name") == "process_name"
             and str(e.get("args", {}).get("name", "")).startswith("/device:GPU")}  # fmt: skip
  derived = {(e["pid"], e.get("tid")) for e in meta if e.get("name") == "thread_name"
             and e.get("args", {}).get("name") in DERIVED_THREADS}  # fmt: skip
  on_device = [e for e in events if e.get("pid") in devices
               and (e.get("pid"), e.get("tid")) not in derived]  # fmt: skip
  if on_device:
    return [_tuple(e) for e in on_device]
  cpu_ops = collections.defaultdict(list)
  for e in events:
    if e.get("cat") == "cpu_op":
      cpu_ops[(e.get("pid"), e.get("tid"))].append(_tuple(e))
  return [k for thread in cpu_ops.values() for k in self_times(thread)]


def _tuple(e: dict[str, Any]) -> tuple[str, float, float, float]:
  ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
  return (str(e.get("name", "")), ts, dur, ts + dur)


def self_times(
  events: Sequence[tuple[str, float, float, float]],
) -> list[tuple[str, float, float, float]]:
  """One thread's nested events, each with the time of the events inside it taken out."""
  events = sorted(events, key=lambda e: (e[1], -e[2]))
  own = [e[2] for e in events]
  stack: list[int] = []
  for i, e in enumerate(events):
    while stack and e[1] >= events[stack[-1]][3]:
      stack.pop()
    if stack:
      own[stack[-1]] -= e[2]
    stack.append(i)
  return [(e[0], e[1], d, e[3]) for e, d in zip(events, own, strict=True)]


def trace_summary(path: str, steps: int = 1) -> dict[str, Any]:
  """`summarize` of a Chrome trace file's device kernels."""
  kernels = device_kernels(read_trace(path))
  if not kernels:
    raise RuntimeError(f"{path}: no device kernels and no CPU ops in the trace")
  return summarize(kernels, steps)


# ----------------------------------------------------------------------------- tables


def format_pair(
  title: str,
  ours: dict[str, Any] | None,
  theirs: dict[str, Any] | None,
  name: str = "torch.compile",
) -> str:
  """Two profiles' `families_ms` side by side (ours, `name`'s, the difference), each row's ms
  a step; a missing side is '-'."""
  lines = [
    title,
    "",
    f"| family | ours ms | {name} ms | ours - {name} |",
    "|---|---|---|---|",
  ]

  def ms(rec: dict[str, Any] | None, fam: str | None) -> float | None:
    if rec is None:
      return None
    return rec["device_ms"] if fam is None else rec["families_ms"].get(fam, 0.0)

  for fam in (*FAMILIES, None):
    a, b = ms(ours, fam), ms(theirs, fam)
    diff = "-" if a is None or b is None else f"{a - b:+.2f}"
    row = TITLES[fam] if fam else "total (device time a step)"
    lines.append(
      f"| {row} | {'-' if a is None else f'{a:.2f}'} | {'-' if b is None else f'{b:.2f}'} "
      f"| {diff} |"
    )
  return "\n".join(lines)
