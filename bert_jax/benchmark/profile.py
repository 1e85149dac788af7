"""Where a step's device time goes: one traced step (`jax.profiler`) as a table of time per
kernel family and the top kernels.

Each op the trace shows (a GPU kernel, or an XLA:CPU thunk) is attributed to the HLO
instruction that launched it (the trace's `hlo_op`, or the kernel's name, which XLA's fusion
kernels share with their instruction) and classified from that instruction in the compiled
module's text (`compiled.as_text()`): its opcode, the ops fused into it, their `op_name`
(JAX's name stack: `jvp(...)`/`transpose(jvp(...))` for the model's forward and backward,
Flax module scopes such as `attention_LayerNorm`, `Dropout_0.keep_mask`) and the Python
functions of their stack frames (`explicit_attention`, `apply_update`, optax's files). These
exist on every backend, so the CPU trace tests the same classifier the GPU uses. A kernel
without an instruction (cuBLAS/cuDNN kernels where the trace gives no `hlo_op`, copies) is
classified by its name (`GPU_KERNEL_PATTERNS`).

Families, first match wins (so attention's dropout bits count as RNG, its matmuls as
attention): RNG (the ops that draw random bits: dropout's, masking's), attention (scores,
softmax, dropout application, context, and their backward, matmuls included; fused attention
kernels), matmuls (every other dot: projections, FFN, MLM head), LayerNorm, optimizer
(clipping, AdamW, the non-finite guard), gather/scatter, copies/transposes, reductions, other
fusions. The total is the sum of the ops' own time (a CPU thunk's time less that of the thunks
inside it), per step.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bert_jax.benchmark import kernel_families

FAMILIES = (
  "rng",
  "attention",
  "matmuls",
  "layernorm",
  "optimizer",
  "gather_scatter",
  "copies",
  "reductions",
  "other",
)
FAMILY_TITLES = {
  "rng": "RNG (dropout bits, masking)",
  "attention": "attention (incl. its matmuls)",
  "matmuls": "matmuls (other dots)",
  "layernorm": "LayerNorm",
  "optimizer": "optimizer (clip, AdamW, guard)",
  "gather_scatter": "gather / scatter",
  "copies": "copies / transposes",
  "reductions": "reductions",
  "other": "other fusions",
}

# Kernel names of the GPU libraries and XLA's GPU emitters on Hopper (H100/H200), for kernels
# the trace does not tie to an HLO instruction. Sources: cuBLAS/cuBLASLt's kernel names
# (sm90_xmma_gemm_*, cutlass3x_sm90_*, and nvjet_* from cuBLAS 12.8+), cuDNN's fused attention
# (cudnn_generated_*sdpa*, *fmha*, *flash*; PyTorch's SDPA: pytorch_flash::flash_fwd_kernel,
# fmha_cutlassF), XLA's fusion kernels (named after their instruction: loop_*_fusion,
# input_reduce_fusion, wrapped_*, gemm_fusion_dot / triton_softmax_*), and CUDA's memcpy and
# memset activities, as public Nsight/XProf traces show them. Not yet checked against a trace
# of this project's step on a GPU (docs/gpu.md). First match wins.
GPU_KERNEL_PATTERNS = (
  ("rng", r"rng|philox|threefry|random"),
  ("attention", r"fmha|flash|sdpa|attention|mha_"),
  ("matmuls", r"gemm|xmma|nvjet|cutlass|cublas|wgmma|matmul"),
  ("layernorm", r"layer_?norm"),
  ("optimizer", r"adam|multi_tensor"),
  ("gather_scatter", r"gather|scatter"),
  ("copies", r"^memcpy|^memset|copy|transpose"),
  ("reductions", r"reduce|reduction"),
)

# The classifier's evidence from HLO (see the module docstring).
# Random bits: XLA's generators, or the integer mixing ops (threefry's, the counter hash's) of
# jax.random and the dropout keep-mask code; not the compare or select that applies a mask.
RNG_OPCODES = {"rng", "rng-bit-generator", "rng-get-and-update-state"}
BIT_OPCODES = {"xor", "shift-left", "shift-right-logical", "shift-right-arithmetic"}
RNG_OP_NAME = re.compile(r"keep_mask|threefry|random_bits|rng_bit_generator|bernoulli|uniform")
ATTENTION_FUNCS = re.compile(r"attention|flash|mha")
ATTENTION_TARGETS = re.compile(r"fmha|flash|attention|mha")
MATMUL_OPCODES = {"dot", "convolution", "ragged-dot"}
MATMUL_TARGETS = re.compile(r"gemm|matmul|cublas|\$conv|cudnn\$fusion")
LAYERNORM = re.compile(r"LayerNorm|layer_norm")
OPTIMIZER_FUNCS = re.compile(r"^apply_update$|update_fn|scale_by_|clip_by_global_norm|all_finite")
GATHER_OPCODES = {"gather", "scatter", "select-and-scatter"}
COPY_OPCODES = {
  "copy", "copy-start", "copy-done", "transpose", "slice", "dynamic-slice",
  "dynamic-update-slice", "concatenate", "pad", "reverse",
}  # fmt: skip
# Ops that move nothing by themselves (inside a fusion they only index or wrap).
TRIVIAL_OPCODES = {
  "parameter", "constant", "bitcast", "reshape", "broadcast", "tuple", "get-tuple-element",
  "iota", "convert",
}  # fmt: skip
REDUCE_OPCODES = {"reduce", "reduce-window", "all-reduce", "reduce-scatter", "sort"}
# Lines of a device plane that XProf derives from the kernels (they would count them twice).
DERIVED_LINES = {
  "XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Framework Ops", "Framework Name Scope",
  "Source code", "Launch Stats", "Async XLA Ops",
}  # fmt: skip


@dataclasses.dataclass
class Instr:
  """One HLO instruction as the classifier sees it."""

  name: str
  opcode: str
  calls: tuple[str, ...] = ()
  target: str = ""
  op_name: str = ""
  frame: int = 0


@dataclasses.dataclass
class Evidence:
  """What an instruction does (with the ops fused into it): its opcodes, op_names, custom-call
  targets and the functions and files of their stack frames."""

  opcodes: set[str] = dataclasses.field(default_factory=set)
  op_names: set[str] = dataclasses.field(default_factory=set)
  targets: set[str] = dataclasses.field(default_factory=set)
  functions: set[str] = dataclasses.field(default_factory=set)
  files: set[str] = dataclasses.field(default_factory=set)
  bits: bool = False  # it draws random bits (RNG_OPCODES, or BIT_OPCODES under RNG_OP_NAME)


_INSTR = re.compile(r"^\s+(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")


def _opcode(rest: str) -> str:
  """The opcode of an instruction's text after `name = ` (its shape first: a token, or a
  parenthesised tuple with spaces inside)."""
  if rest.startswith("("):
    depth = 0
    for i, c in enumerate(rest):
      depth += c == "("
      depth -= c == ")"
      if depth == 0:
        rest = rest[i + 1 :]
        break
  else:
    rest = rest.split(" ", 1)[1] if " " in rest else ""
  m = re.match(r"\s*([\w\-]+)\(", rest)
  return m.group(1) if m else ""


class HloIndex:
  """An optimised HLO module's text, indexed by instruction name."""

  def __init__(self, text: str):
    self.module = ""
    m = re.match(r"HloModule\s+([^\s,]+)", text)
    if m:
      self.module = m.group(1)
    self.instrs: dict[str, Instr] = {}
    self.computations: dict[str, list[str]] = collections.defaultdict(list)
    tables: dict[str, list[str]] = collections.defaultdict(list)
    section, current = "", ""
    for line in text.splitlines():
      if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
        section = line
        continue
      if section and line.strip() and line[0].isdigit():
        tables[section].append(line)
        continue
      section = ""
      if not line.startswith(" "):
        c = _COMPUTATION.match(line)
        if c:
          current = c.group(1)
        continue
      m = _INSTR.match(line)
      if not m:
        continue
      name, rest = m.groups()
      calls = re.findall(r"\bcalls=%?([\w.\-]+)", rest)
      for group in re.findall(r"called_computations=\{([^}]*)\}", rest):
        calls += [c.strip().lstrip("%") for c in group.split(",") if c.strip()]
      target = re.search(r'custom_call_target="([^"]*)"', rest)
      op_name = re.search(r'op_name="((?:[^"\\]|\\.)*)"', rest)
      frame = re.search(r"stack_frame_id=(\d+)", rest)
      self.instrs[name] = Instr(
        name,
        _opcode(rest),
        tuple(calls),
        target.group(1) if target else "",
        op_name.group(1) if op_name else "",
        int(frame.group(1)) if frame else 0,
      )
      self.computations[current].append(name)
    self._frames = _frame_table(tables)
    self._evidence: dict[str, Evidence] = {}

  def lookup(self, *names: str) -> Instr | None:
    """The first of `names` that is an instruction here; a kernel's name also matches with
    its `_N` suffix read as `.N` (XLA names a fusion's kernel after it)."""
    for name in names:
      if not name:
        continue
      for candidate in (name, re.sub(r"_(\d+)$", r".\1", name)):
        if candidate in self.instrs:
          return self.instrs[candidate]
    return None

  def evidence(self, name: str) -> Evidence:
    """An instruction's evidence, with that of the computations it calls (a fusion's fused
    ops, a custom call's body); not a loop's or a conditional's (their ops are traced
    separately)."""
    if name in self._evidence:
      return self._evidence[name]
    ins = self.instrs[name]
    ev = Evidence({ins.opcode}, {ins.op_name} - {""}, {ins.target} - {""})
    ev.bits = ins.opcode in RNG_OPCODES or (
      ins.opcode in BIT_OPCODES and bool(RNG_OP_NAME.search(ins.op_name))
    )
    functions, files = self._frames.get(ins.frame, ((), ()))
    ev.functions.update(functions)
    ev.files.update(files)
    for comp in ins.calls:
      for inner in self.computations.get(comp, ()):
        sub = self.evidence(inner)
        for f in ("opcodes", "op_names", "targets", "functions", "files"):
          getattr(ev, f).update(getattr(sub, f))
        ev.bits |= sub.bits
    self._evidence[name] = ev
    return ev


def _frame_table(tables: dict[str, list[str]]) -> dict[int, tuple[tuple[str, ...], tuple]]:
  """Stack frame id -> (functions, files) along its chain of callers. The printed
  parent_frame_id is the parent's id + 1 (0: none), as XLA writes the module's frame table."""

  def entries(section: str) -> dict[int, str]:
    return {int(x.split(None, 1)[0]): x.split(None, 1)[1] for x in tables.get(section, ())}

  files = {k: v.strip().strip('"') for k, v in entries("FileNames").items()}
  funcs = {k: v.strip().strip('"') for k, v in entries("FunctionNames").items()}
  locs = {
    k: dict((a, int(b)) for a, b in re.findall(r"(\w+)=(\d+)", v))
    for k, v in entries("FileLocations").items()
  }
  frames = {
    k: dict((a, int(b)) for a, b in re.findall(r"(\w+)=(\d+)", v))
    for k, v in entries("StackFrames").items()
  }
  out: dict[int, tuple[tuple[str, ...], tuple]] = {}
  for fid in frames:
    fn, fl, seen, cur = [], [], set(), fid
    while cur in frames and cur not in seen:
      seen.add(cur)
      loc = locs.get(frames[cur].get("file_location_id", 0), {})
      fn.append(funcs.get(loc.get("function_name_id", 0), ""))
      fl.append(files.get(loc.get("file_name_id", 0), ""))
      cur = frames[cur].get("parent_frame_id", 0) - 1
    out[fid] = (tuple(fn), tuple(fl))
  return out


def classify(ev: Evidence) -> str:
  """An instruction's family from its evidence (module docstring)."""
  model = any("jvp(" in n for n in ev.op_names)  # the model's forward or backward
  if ev.bits:
    return "rng"
  if any(ATTENTION_TARGETS.search(t.lower()) for t in ev.targets) or (
    model and any(ATTENTION_FUNCS.search(f) for f in ev.functions)
  ):
    return "attention"
  if ev.opcodes & MATMUL_OPCODES or any(MATMUL_TARGETS.search(t.lower()) for t in ev.targets):
    return "matmuls"
  if any(LAYERNORM.search(n) for n in ev.op_names):
    return "layernorm"
  if not model and (
    any(OPTIMIZER_FUNCS.search(f) for f in ev.functions) or any("optax" in f for f in ev.files)
  ):
    return "optimizer"
  if ev.opcodes & GATHER_OPCODES:
    return "gather_scatter"
  work = ev.opcodes - TRIVIAL_OPCODES - {"fusion"}
  if work and work <= COPY_OPCODES:
    return "copies"
  if ev.opcodes & REDUCE_OPCODES:
    return "reductions"
  return "other"


def classify_name(kernel: str) -> str:
  """A kernel's family from its name alone (`GPU_KERNEL_PATTERNS`), else "other"."""
  for family, pattern in GPU_KERNEL_PATTERNS:
    if re.search(pattern, kernel, re.IGNORECASE):
      return family
  return "other"


@dataclasses.dataclass
class Event:
  """One op of the trace: a kernel, or a thunk with its own time (less its children's)."""

  name: str
  hlo_op: str
  module: str
  start_ns: float
  dur_ns: float  # its own time
  end_ns: float


def _stats(event: Any) -> dict[str, Any]:
  return {k: v for k, v in event.stats}


def _annotation(stats: dict[str, Any], key: str) -> str:
  """`key` from the event's stats, or from an annotation string (XLA's GPU kernels carry
  `XlaModule:#hlo_module=...#` and `Thunk:#name=...,hlo_op=...#`)."""
  if stats.get(key):
    return str(stats[key])
  for v in stats.values():
    if isinstance(v, str) and f"{key}=" in v:
      m = re.search(rf"{key}=([^,#:]+)", v)
      if m:
        return m.group(1)
  return ""


def trace_events(planes: Iterable[Any]) -> list[Event]:
  """The trace's ops: a device plane's kernels where there are any (GPU), else the host's
  thunks that name an HLO op (XLA:CPU), each with its own time."""
  device, host = [], []
  for plane in planes:
    on_device = plane.name.startswith("/device:")
    for line in plane.lines:
      if on_device and line.name in DERIVED_LINES:
        continue
      evs = []
      for e in line.events:
        stats = _stats(e)
        hlo_op = _annotation(stats, "hlo_op")
        if not on_device and not hlo_op:
          continue
        module = _annotation(stats, "hlo_module")
        evs.append(Event(e.name, hlo_op, module, e.start_ns, e.duration_ns, e.end_ns))
      (device if on_device else host).extend(evs if on_device else _self_times(evs))
  return device or host


def _self_times(events: list[Event]) -> list[Event]:
  """Events of one thread, each with the time of the events nested in it taken out."""
  events = sorted(events, key=lambda e: (e.start_ns, -e.dur_ns))
  own = [e.dur_ns for e in events]
  stack: list[int] = []
  for i, e in enumerate(events):
    while stack and e.start_ns >= events[stack[-1]].end_ns:
      stack.pop()
    if stack:
      own[stack[-1]] -= e.dur_ns
    stack.append(i)
  return [dataclasses.replace(e, dur_ns=d) for e, d in zip(events, own, strict=True)]


def _of_module(events: Sequence[Event], hlo: HloIndex | None) -> list[Event]:
  """The events of the module `hlo` indexes (all of them without an index)."""
  module = hlo.module if hlo else ""
  return [e for e in events if not (module and e.module and e.module != module)]


def kernel_context(hlo: HloIndex | None, e: Event) -> str:
  """The opcodes of the HLO instruction behind a kernel, as `kernel_families.classify` reads
  them for XLA's generic fusion names ("" where there is no instruction)."""
  ins = hlo.lookup(e.hlo_op, e.name) if hlo else None
  if ins is None:
    return ""
  return " ".join(sorted(hlo.evidence(ins.name).opcodes - TRIVIAL_OPCODES - {"fusion"}))


def kernel_summary(events: Sequence[Event], hlo: HloIndex | None, steps: int) -> dict[str, Any]:
  """The same events by `kernel_families` (kernel names: the classifier PyTorch's trace is read
  with), as `kernel_families.summarize` gives them."""
  events = _of_module(events, hlo)
  contexts = {}
  for e in events:
    if e.name not in contexts and kernel_families.GENERIC.match(e.name):
      contexts[e.name] = kernel_context(hlo, e)
  tuples = [(e.name, e.start_ns / 1e3, e.dur_ns / 1e3, e.end_ns / 1e3) for e in events]
  return kernel_families.summarize(tuples, steps, contexts)


def summarize(
  events: Sequence[Event], hlo: HloIndex | None, steps: int, top: int = 12
) -> dict[str, Any]:
  """Per-step ms by family, the top kernels, and how much of the time was tied to an HLO
  instruction of the module (events of other modules are left out)."""
  fam_ns: dict[str, float] = dict.fromkeys(FAMILIES, 0.0)
  kernels: dict[str, dict[str, Any]] = {}
  attributed = 0.0
  starts, ends = [], []
  for e in _of_module(events, hlo):
    ins = hlo.lookup(e.hlo_op, e.name) if hlo else None
    family = classify(hlo.evidence(ins.name)) if ins else classify_name(e.name)
    attributed += e.dur_ns if ins else 0.0
    fam_ns[family] += e.dur_ns
    k = kernels.setdefault(
      e.name,
      {"kernel": e.name, "family": family, "calls": 0, "ns": 0.0, "hlo_op": ins and ins.name,
       "op": ins and _short(ins.op_name)},
    )  # fmt: skip
    k["calls"] += 1
    k["ns"] += e.dur_ns
    starts.append(e.start_ns)
    ends.append(e.end_ns)
  total = sum(fam_ns.values())
  ranked = sorted(kernels.values(), key=lambda k: -k["ns"])[:top]
  return {
    "steps": steps,
    "device_ms": total / steps / 1e6,
    "span_ms": (max(ends) - min(starts)) / steps / 1e6 if starts else 0.0,
    "families_ms": {f: ns / steps / 1e6 for f, ns in fam_ns.items()},
    "attributed": attributed / total if total else 0.0,
    "ops": len(kernels),
    "top": [
      {
        **{k: v for k, v in r.items() if k != "ns"},
        "calls": r["calls"] / steps,
        "ms": r["ns"] / steps / 1e6,
      }
      for r in ranked
    ],  # fmt: skip
  }


def _short(op_name: str) -> str:
  """An op_name without the jitted function's prefix, at most 80 characters."""
  name = re.sub(r"^jit\([^)]*\)/", "", op_name)
  return name if len(name) <= 80 else "..." + name[-77:]


def latest_xplane(log_dir: str) -> str:
  """The newest `*.xplane.pb` that `jax.profiler.trace(log_dir)` wrote."""
  paths = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
  if not paths:
    raise RuntimeError(f"jax.profiler wrote no .xplane.pb under {log_dir}")
  return max(paths, key=os.path.getmtime)


def parse_trace(path: str, hlo_text: str | None, steps: int) -> dict[str, Any]:
  """`summarize` of a trace file (`jax.profiler`'s .xplane.pb) against the module's text, with
  the same events by kernel name (`kernel_summary`) under `kernel_families_ms`,
  `kernel_device_ms` and `kernel_top`."""
  import jax

  data = jax.profiler.ProfileData.from_file(path)
  hlo = HloIndex(hlo_text) if hlo_text else None
  events = trace_events(data.planes)
  if not events:
    raise RuntimeError(
      f"{path}: no device kernels and no XLA ops in the trace (on a GPU: is CUPTI there?)"
    )
  by_name = kernel_summary(events, hlo, steps)
  return {
    **summarize(events, hlo, steps),
    "kernel_families_ms": by_name["families_ms"],
    "kernel_device_ms": by_name["device_ms"],
    "kernel_top": by_name["top"],
  }


def profile_step(
  run: Callable[[], Any],
  hlo_text: str,
  steps: int = 1,
  log_dir: str | None = None,
  trace_out: str | None = None,
) -> dict[str, Any]:
  """Traces `steps` calls of `run` (each must wait for its step) and summarises them per step;
  the trace is kept under `log_dir` when given (jax.profiler's tree of files), and the Chrome
  trace it writes beside the .xplane.pb (`HOST.trace.json.gz`) is copied to the file
  `trace_out` when given."""
  import jax

  with tempfile.TemporaryDirectory() as tmp:
    where = log_dir or tmp
    t0 = time.perf_counter()
    with jax.profiler.trace(where):
      for _ in range(steps):
        run()
    trace_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    path = latest_xplane(where)
    out = parse_trace(path, hlo_text, steps)
    kept = path if log_dir else None
    if trace_out:
      # The numbers stand without the file: a missing Chrome trace is a note, not an error.
      chrome = glob.glob(os.path.join(os.path.dirname(path), "*.trace.json.gz"))
      if chrome:
        os.makedirs(os.path.dirname(trace_out) or ".", exist_ok=True)
        shutil.copyfile(max(chrome, key=os.path.getmtime), trace_out)
        kept = trace_out
      else:
        out["trace_note"] = f"jax.profiler wrote no Chrome trace beside {os.path.basename(path)}"
  return {**out, "trace_s": trace_s, "parse_s": time.perf_counter() - t0, "trace_file": kept}


def format_profile(rec: dict[str, Any]) -> str:
  """A profile record as a markdown table (families, then the top kernels)."""
  var = ",".join(f"{k}={v}" for k, v in rec.get("variant", {}).items()) or "-"
  head = (
    f"profile: {rec.get('side', '')} {rec.get('task', '')} {rec.get('size', '')} "
    f"{rec.get('seq', '')} x {rec.get('batch', '')} {var} ({rec['steps']} step(s) traced): "
    f"{rec['device_ms']:.1f} ms of device time a step, {rec['span_ms']:.1f} ms first op to "
    f"last; {rec['attributed']:.0%} tied to HLO ops"
  )
  total = rec["device_ms"] or 1.0
  lines = [head, "", "| family | ms / step | share |", "|---|---|---|"]
  for f in FAMILIES:
    ms = rec["families_ms"].get(f, 0.0)
    lines.append(f"| {FAMILY_TITLES[f]} | {ms:.2f} | {ms / total:.1%} |")
  lines.append(f"| total | {rec['device_ms']:.2f} | 100% |")
  lines += [
    "",
    "| top kernels | family | calls / step | ms / step | HLO op |",
    "|---|---|---|---|---|",
  ]
  for k in rec["top"]:
    name = k["kernel"] if len(k["kernel"]) <= 60 else k["kernel"][:57] + "..."
    what = f"{k['hlo_op']} ({k['op']})" if k.get("hlo_op") else "-"
    lines.append(f"| {name} | {k['family']} | {k['calls']:g} | {k['ms']:.3f} | {what} |")
  return "\n".join(lines)
