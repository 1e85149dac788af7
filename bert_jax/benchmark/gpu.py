"""The GPU comparison (`python -m bert_jax.benchmark --gpu`): our train steps against
transformers' PyTorch BERT on the same GPU, in one command that ends within `--deadline`.

Ours is the trainer's jitted pretraining step (`step.py`) and the fine-tuning engine's step
(`finetune_step.py`), bf16 compute with float32 params, at each shape, with the model the
trainer runs by default on the device (whatever its `auto` fields resolve to there), and its
variants (model fields, XLA options). The peers are transformers' BertForPreTraining /
BertForSequenceClassification, eager and torch.compile, SDPA attention, bf16 autocast, fused
AdamW, clipping at 1.0, dropout 0.1 (or a peer variant's), on the same batch (15% of positions
masked). What runs is planned first (`gpu_plan.py`: priority order, estimates, what fits).

Two worker processes, ours (`gpu_ours.py`) and PyTorch's (`peer_worker.gpu_session`), go
through the phases together, each phase started by the parent: start (imports, the device,
our matmul programs); alone (our cold build of the `--compile_alone` shape, then
torch.compile's, each while the other worker idles); build (everything else, both sides in
parallel; our variants start whenever `gpu_plan.BuildGate` says they still fit); then, with no
compile running anywhere, PyTorch's worker times its matmuls and steps, profiles its planned
steps (torch.profiler) and exits (freeing its memory), then ours does the same (jax.profiler,
`profile.py`). Both profiles are read by one kernel-name classifier (`kernel_families.py`) and
tabled side by side. The parent then derives `gemm` (our bf16 matmul against PyTorch's, as one
call and as a chain of products, and what the gap costs our profiled steps) and
`compile_alone` records, and prints issue 44's must-show figures (`must_show`).

MFU counts the same model FLOPs for every implementation (`sizes.standard_flops_per_token`:
every layer at every position, the MLM head at the masked positions) against two peaks: the
datasheet's dense bf16 for the device kind, and the bf16 matmul (bf16 result) measured in the
same process as a chain of products (one call's time includes its dispatch; ours also reports
its float32-result matmul).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from bert_jax import backends
from bert_jax.benchmark import (
  gpu_plan,
  kernel_families,
  lockstep,
  peers,
  profile,
  sizes,
  suite,
  tables,
)
from bert_jax.runtime import compile_cache

# Past the deadline, a build that had to start (a shape) may still be running: the parent waits
# this long for its workers before it stops them (tools/gpu/device_run.sh's hard timeout is
# the deadline + this + a margin).
GRACE_S = 20.0


def datasheet_tflops(device_kind: str) -> float | None:
  """The dense bf16 datasheet peak of a device kind in TFLOP/s (`backends.PEAK_BF16_FLOPS`, the
  trainer's table), or None (not in the table)."""
  flops = backends.peak_flops(device_kind)
  return None if flops is None else flops / 1e12


def enrich(rec: dict[str, Any], peaks: dict[str, float]) -> dict[str, Any]:
  """A worker's step record with rates, the standard FLOPs and both MFUs (`peaks`: this
  side's measured matmul TFLOP/s and the datasheet's, by name)."""
  flops = sizes.standard_flops_per_token(rec["size"], rec["seq"], rec["task"])
  tokens_per_s = rec["batch"] * rec["seq"] / rec["step_s"]
  out = {
    **rec,
    "tokens_per_s": tokens_per_s,
    "seq_per_s": rec["batch"] / rec["step_s"],
    "flops_per_token": flops,
    "tflops": tokens_per_s * flops / 1e12,
  }
  for name, peak in peaks.items():
    if peak:
      out[f"mfu_{name}"] = out["tflops"] / peak
  return out


def _worker_env(side: str, smoke: bool) -> dict[str, str]:
  if side == "torch":
    return {
      "PYTORCH_CUDA_ALLOC_CONF": os.environ.get(
        "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"
      )
    }
  # JAX grows its pool as it needs (the PyTorch worker shares the GPU), up to 92% of it.
  return {
    "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu" if smoke else ""),
    "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
    "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92"),
  }


def run_gpu(
  smoke: bool,
  deadline_s: float,
  variants: Sequence[dict[str, Any]] | None,
  torch_modes: Sequence[str],
  steps: int,
  reps: int,
  warmup: int,
  compile_threads: int,
  peer_python: str,
  json_out: str | None,
  shapes: Sequence[str] | None = None,
  profile: Sequence[str] | None = None,
  profile_dir: str | None = None,
  dry_run: bool = False,
  prepare_delay_s: float = 0.0,
  alone: str | None = None,
) -> list[dict[str, Any]]:
  """The whole comparison; returns every record (also emitted as JSON lines as they come).
  `dry_run`: only the plan (`gpu_plan.format_plan`). `prepare_delay_s` slows our worker's
  preparation of each plan by that much (the tests' stand-in for a loaded host). `alone`: the
  shape whose cold build each side makes alone (`gpu_plan.make_plans`)."""
  t0 = time.time()
  end_by = t0 + deadline_s
  plans = gpu_plan.make_plans(smoke, variants, torch_modes, shapes, profile, alone)
  records: list[dict[str, Any]] = []
  lock = threading.Lock()

  def emit(rec: dict[str, Any]) -> None:
    with lock:
      rec = {**rec, "t_s": round(time.time() - t0, 1)}
      records.append(rec)
      suite.emit(rec, json_out)

  if not dry_run and any(p["side"] == "torch" for p in plans):
    if not peers.peer_available(peer_python)["torch"]:
      note = f"torch/transformers not importable in {peer_python}: no peers"
      emit({"kind": "note", "side": "torch", "note": note})
      plans = [p for p in plans if p["side"] != "torch"]
  taken, left, sim = gpu_plan.admit(plans, deadline_s, steps, reps, warmup, compile_threads, smoke)
  build_until = end_by - gpu_plan.timing_reserve(sim)
  # Our variants left out wait on standby (built and timed if time is left over), when our
  # worker runs at all.
  ours_runs = any(p["side"] == "ours" for p in taken)
  standby = [
    {**p, "standby": True}
    for p in left
    if ours_runs and p["side"] == "ours" and p["role"] == "variant"
  ]
  emit(
    {
      "kind": "gpu_plan",
      "smoke": smoke,
      "deadline_s": deadline_s,
      "build_s": build_until - t0,
      "timing_reserve_s": gpu_plan.timing_reserve(sim),
      "planned_end_s": sim["end_s"],
      "alone_end_s": sim["alone_end_s"],
      "schedule": {k: [round(a, 1), round(b, 1)] for k, (a, b) in sim["at"].items()},
      "plans": taken,
      "standby": [p["id"] for p in standby],
    }
  )
  for p in left:
    if not any(q["id"] == p["id"] for q in standby):
      emit({**_base(p), "kind": "skipped", "why": "build deadline", "planned": True})
  if dry_run:
    print(gpu_plan.format_plan(taken, left, sim, deadline_s))
    return records
  common = {
    "session": "gpu",
    "build_until": build_until,
    "end_by": end_by,
    "steps": steps,
    "reps": reps,
    "warmup": warmup,
    "matmul_n": 512 if smoke else 8192,
    "compile_threads": compile_threads,
    "profile_dir": profile_dir,
    "profile_s": gpu_plan.PROFILE_S["torch"],
    "hard_until": end_by + GRACE_S,
  }
  peaks: dict[str, dict[str, float]] = {"ours": {}, "torch": {}}

  def on_record(rec: dict[str, Any]) -> None:
    side = rec.get("side", "")
    if rec["kind"] == "env":
      peaks[side]["datasheet"] = datasheet_tflops(rec.get("device_kind", ""))
    elif rec["kind"] == "peak":
      # The chained products: the GEMM rate without a call's dispatch (the one call beside).
      peaks[side]["measured_peak"] = rec.get("tflops_chain") or rec["tflops"]
      if rec.get("tflops_f32out"):
        peaks[side]["measured_peak_f32out"] = rec["tflops_f32out"]
    elif rec["kind"] == "step":
      rec = enrich(rec, peaks[side])
    emit(rec)

  workers: dict[str, lockstep.LockstepWorker] = {}
  ours = [p for p in taken if p["side"] == "ours"] + standby
  specs = {"ours": ours, "torch": [p for p in taken if p["side"] == "torch"]}
  for side, side_plans in specs.items():
    if not side_plans:
      continue
    spec = {**common, "plans": side_plans}
    if side == "ours":
      spec.update(prepare_delay_s=prepare_delay_s, gate=gpu_plan.gate_spec(sim, t0))
      order = gpu_plan.build_order([p for p in side_plans if not p.get("standby")])
      spec["build_order"] = [p["id"] for p in order] + [p["id"] for p in standby]
    argv = ours_argv(spec) if side == "ours" else peers.peer_argv(peer_python, spec)
    workers[side] = lockstep.LockstepWorker(
      f"gpu-{side}",
      argv,
      deadline_s + GRACE_S,
      env=_worker_env(side, smoke),
      wait=False,
      on_record=on_record,
    )

  def left_s() -> float:
    return max(1.0, end_by + GRACE_S - time.time())

  def phase(side: str, command: str) -> None:
    """One phase of one worker (a `LockstepWorker.command`); a worker that fails is closed."""
    w = workers.get(side)
    if w is None or w.proc.poll() is not None:
      return
    try:
      if command == "start":
        w.wait_ready(left_s())
      else:
        w.command(command, left_s())
    except RuntimeError as e:
      emit({"kind": "error", "side": side, "error": str(e)[-500:]})
      w.close()

  def both(command: str) -> None:
    threads = [threading.Thread(target=phase, args=(s, command)) for s in workers]
    for t in threads:
      t.start()
    for t in threads:
      t.join()

  both("start")
  # Each side's cold build of the alone shape with nothing else compiling: ours, then PyTorch's.
  for side in ("ours", "torch"):
    if any(p.get("alone") for p in specs[side]):
      phase(side, "alone")
  both("build")
  # PyTorch first: its worker then exits and frees its memory for ours, which cannot free its
  # (JAX keeps its pool), so the largest of our steps runs with the whole device.
  for side in ("torch", "ours"):
    w = workers.get(side)
    if w is None or w.proc.poll() is not None:
      continue
    try:
      w.finish("time", left_s())
    except RuntimeError as e:
      emit({"kind": "error", "side": side, "error": str(e)[-500:]})
    finally:
      w.close()
  for rec in summary_records(records):
    emit(rec)
  emit({"kind": "gpu_done", "wall_s": time.time() - t0, "deadline_s": deadline_s})
  return records


def summary_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """What the parent derives from both sides' records: `gemm` (our bf16 matmul against
  PyTorch's, each as one call and as a chain of products, and what the chain's gap costs each
  profiled step of ours: its GEMM kernels' ms times the gap) and `compile_alone` (each side's
  cold build of the alone shape, made with nothing else compiling)."""
  out = []
  peak = {r["side"]: r for r in records if r.get("kind") == "peak"}
  if "ours" in peak and "torch" in peak:
    o, t = peak["ours"], peak["torch"]
    rec: dict[str, Any] = {
      "kind": "gemm",
      "matmul_n": o.get("matmul_n"),
      "ours_call_tflops": o["tflops"],
      "ours_chain_tflops": o.get("tflops_chain"),
      "torch_call_tflops": t["tflops"],
      "torch_chain_tflops": t.get("tflops_chain"),
      "call_ratio": o["tflops"] / t["tflops"],
      "gemm_backend": o.get("gemm_backend"),
      "torch_chain_timer": t.get("chain_timer"),
    }
    if o.get("tflops_chain") and t.get("tflops_chain"):
      ratio = o["tflops_chain"] / t["tflops_chain"]
      rec["chain_ratio"] = ratio
      rec["within_5pct"] = ratio >= 0.95
      rec["steps"] = []
      for p in records:
        if p.get("kind") == "profile" and p.get("side") == "ours" and p.get("kernel_families_ms"):
          gemm_ms = p["kernel_families_ms"]["gemm"]
          rec["steps"].append(
            {
              "of": p["of"],
              "size": p["size"],
              "seq": p["seq"],
              "batch": p["batch"],
              "step_device_ms": p["kernel_device_ms"],
              "gemm_ms": gemm_ms,
              # At PyTorch's rate our step's GEMMs would take gemm_ms * ratio.
              "gap_ms": max(0.0, gemm_ms * (1 - ratio)),
            }
          )
    out.append(rec)
  built = [r for r in records if r.get("kind") == "built" and r.get("alone")]
  steps = {r["id"]: r for r in records if r.get("kind") == "step"}
  o = next((r for r in built if r["side"] == "ours"), None)
  t = next((r for r in built if r["side"] == "torch"), None)
  if o or t:
    rec = {"kind": "compile_alone", "task": (o or t)["task"], "size": (o or t)["size"],
           "seq": (o or t)["seq"], "batch": (o or t)["batch"]}  # fmt: skip
    if o:
      rec.update(
        ours_build_s=o["build_s"],
        ours_lower_s=o["lower_s"],
        ours_compile_s=o["compile_s"] - o["lower_s"],
        ours_init_compile_s=o["init_compile_s"],
        ours_cache_hit=o["compile_cache_hit"],
      )
    if t:
      # torch.compile compiles inside its first call: that call less a steady step.
      steady = steps.get(t["id"], {}).get("step_s", 0.0)
      rec.update(torch_impl=t["impl"], torch_compile_s=t["first_step_s"] - steady)
    if o and t and rec["torch_compile_s"] > 0:
      rec["ratio"] = rec["ours_build_s"] / rec["torch_compile_s"]
    out.append(rec)
  return out


def _base(plan: dict[str, Any]) -> dict[str, Any]:
  keys = ("id", "side", "impl", "task", "size", "seq", "batch", "variant")
  return {k: plan[k] for k in keys}


def _index(plan_id: str) -> int:
  """A plan's position in its side's list ("ours3" -> 3)."""
  return int("".join(c for c in plan_id if c.isdigit()) or 0)


def _fmt(x: Any, spec: str) -> str:
  return "-" if x is None else format(x, spec)


def _attention_dropout(r: dict[str, Any]) -> float:
  """A row's attention dropout (0.1 unless its variant sets it): rows are compared with the
  torch.compile row of the same shape and attention dropout."""
  return float(r.get("variant", {}).get("attention_dropout_prob", 0.1))


def format_gpu_table(records: Sequence[dict[str, Any]]) -> str:
  """The comparison: one row per timed step, what was skipped or failed, then the profiles."""
  env = {r["side"]: r for r in records if r.get("kind") == "env"}
  peak = {r["side"]: r for r in records if r.get("kind") == "peak"}
  built = {r["id"]: r for r in records if r.get("kind") == "built"}
  steps = [r for r in records if r.get("kind") == "step"]
  lines = []
  for side, r in env.items():
    what = (
      f"jax {r['jax']}"
      if side == "ours"
      else f"torch {r['torch']}, transformers {r['transformers']}"
    )
    sheet = datasheet_tflops(r.get("device_kind", ""))
    pk = peak.get(side, {})
    f32 = f", {pk['tflops_f32out']:.3g} with a float32 result" if pk.get("tflops_f32out") else ""
    lines.append(
      f"{side}: {r.get('device_kind', '?')} ({what}); bf16 matmul "
      f"{_fmt(pk.get('tflops_chain'), '.3g')} TFLOP/s in a chain of "
      f"{pk.get('chain_products', '-')} products, {_fmt(pk.get('tflops'), '.3g')} as one call "
      f"(bf16 result{f32}), datasheet "
      f"{_fmt(sheet, '.0f')}"
    )
  compiled = {
    (r["task"], r["size"], r["seq"], r["batch"], _attention_dropout(r)): r["tokens_per_s"]
    for r in steps
    if r["impl"] == "torch_compile"
  }
  lines += [
    "",
    "| task | model | seq x batch | impl | variant | seq/s | tokens/s | step ms | MFU datasheet "
    "| MFU measured peak | step GiB | compile s | vs torch.compile |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  impls = {"bert_jax": 0, "torch": 1, "torch_compile": 2}

  def row_order(r: dict[str, Any]) -> tuple:
    size = tables.SIZES_ORDER.get(r["size"], 99)
    return (r["task"] != "pretrain", size, r["seq"], impls.get(r["impl"], 9), _index(r["id"]))

  for r in sorted(steps, key=row_order):
    b = built.get(r["id"], {})
    if r["side"] == "ours":
      comp = _fmt(b.get("compile_s"), ".0f") + (" (cached)" if b.get("compile_cache_hit") else "")
      comp += " (alone)" if b.get("alone") else ""
      mem = b.get("mem_gib")
    else:  # torch.compile compiles inside its first call
      comp = _fmt(r["first_step_s"] - r["step_s"], ".0f") if r["impl"] == "torch_compile" else "-"
      comp += " (alone)" if r["impl"] == "torch_compile" and b.get("alone") else ""
      mem = r.get("mem_gib")
    var = ",".join(f"{k}={v}" for k, v in r["variant"].items()) or "-"
    ref = compiled.get((r["task"], r["size"], r["seq"], r["batch"], _attention_dropout(r)))
    lines.append(
      f"| {r['task']} | {r['size']} | {r['seq']} x {r['batch']} | {r['impl']} | {var} | "
      f"{r['seq_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | {1e3 * r['step_s']:.1f} | "
      f"{_fmt(r.get('mfu_datasheet'), '.1%')} | {_fmt(r.get('mfu_measured_peak'), '.1%')} | "
      f"{_fmt(mem, '.1f')} | {comp} | {_fmt(ref and r['tokens_per_s'] / ref, '.2f')} |"
    )
  for r in records:
    if r.get("kind") in ("skipped", "error"):
      keys = ("side", "impl", "task", "size", "seq", "batch")
      what = " ".join(str(r[k]) for k in keys if k in r)
      if str(r.get("id", "")).startswith("profile:"):
        what = what.replace("bert_jax", "profile of", 1)
      var = ",".join(f"{k}={v}" for k, v in r.get("variant", {}).items())
      why = r.get("why") or r.get("error")
      lines.append(f"{r['kind']}: {what} {var} - {why}".replace("  ", " "))
  done = [r for r in records if r.get("kind") == "gpu_done"]
  if done:
    lines.append(f"wall {done[-1]['wall_s']:.0f} s (deadline {done[-1]['deadline_s']:.0f} s)")
  profiles = [r for r in records if r.get("kind") == "profile"]
  for r in profiles:
    if r["side"] == "ours":
      lines += ["", profile.format_profile(r)]
  for r in profiles:
    if r["side"] != "ours":
      continue
    theirs = next((q for q in profiles if q["side"] == "torch" and _same_shape(q, r)), None)
    if theirs:
      lines += ["", format_profile_pair(r, theirs)]
  for r in records:
    if r.get("kind") == "gemm":
      lines += ["", format_gemm(r)]
    elif r.get("kind") == "compile_alone":
      lines += ["", format_compile_alone(r)]
  lines += ["", *must_show(records)]
  return "\n".join(lines)


def _same_shape(a: dict[str, Any], b: dict[str, Any]) -> bool:
  return all(a.get(k) == b.get(k) for k in ("task", "size", "seq", "batch"))


def format_profile_pair(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
  """Our profiled step and PyTorch's at the same shape, by the same kernel-name families
  (`kernel_families`), then each side's top kernels."""
  shape = f"{ours['task']} {ours['size']} {ours['seq']} x {ours['batch']}"
  mine = {"families_ms": ours["kernel_families_ms"], "device_ms": ours["kernel_device_ms"]}
  other = {"families_ms": theirs["kernel_families_ms"], "device_ms": theirs["kernel_device_ms"]}
  title = f"kernels by family, {shape}: ours ({ours['of']}) and {theirs['impl']} ({theirs['of']})"
  name = theirs["impl"].replace("torch_compile", "torch.compile")
  lines = [kernel_families.format_pair(title, mine, other, name)]
  for who, rec in (("ours", ours), (theirs["impl"], theirs)):
    lines += [
      "",
      f"| top kernels ({who}) | family | calls / step | ms / step |",
      "|---|---|---|---|",
    ]
    for k in rec.get("kernel_top", []):
      name = k["kernel"] if len(k["kernel"]) <= 70 else k["kernel"][:67] + "..."
      lines.append(f"| {name} | {k['family']} | {k['calls']:g} | {k['ms']:.3f} |")
  return "\n".join(lines)


def format_gemm(r: dict[str, Any]) -> str:
  """The `gemm` record in words: both sides' bf16 matmul, one call and a chain, and what the
  chain's gap costs each profiled step of ours."""
  n = r.get("matmul_n")
  out = (
    f"bf16 {n}-cube matmul, bf16 result: ours {_fmt(r.get('ours_chain_tflops'), '.3g')} TFLOP/s "
    f"in a chain, {r['ours_call_tflops']:.3g} as one call ({r.get('gemm_backend')}); PyTorch "
    f"{_fmt(r.get('torch_chain_tflops'), '.3g')} in a chain ({r.get('torch_chain_timer')}), "
    f"{r['torch_call_tflops']:.3g} as one call; ours / PyTorch: chain "
    f"{_fmt(r.get('chain_ratio'), '.3f')}, one call {r['call_ratio']:.3f}"
  )
  for st in r.get("steps", []):
    out += (
      f"\n  {st['size']} {st['seq']} x {st['batch']} ({st['of']}): GEMM kernels "
      f"{st['gemm_ms']:.1f} of {st['step_device_ms']:.1f} ms a step; at PyTorch's rate "
      f"{st['gap_ms']:.1f} ms less"
    )
  return out


def format_compile_alone(r: dict[str, Any]) -> str:
  """The `compile_alone` record in words."""
  shape = f"{r['size']} {r['seq']} x {r['batch']}"
  ours = (
    f"ours {r['ours_build_s']:.1f} s (lowering {r['ours_lower_s']:.1f}, compile "
    f"{r['ours_compile_s']:.1f}, state init {r['ours_init_compile_s']:.1f} beside it"
    f"{', cached' if r.get('ours_cache_hit') else ''})"
    if "ours_build_s" in r
    else "ours not built"
  )
  theirs = (
    f"{r['torch_impl']} {r['torch_compile_s']:.1f} s (first step less a steady one)"
    if "torch_compile_s" in r
    else "PyTorch's not built"
  )
  ratio = f"; ours / PyTorch {r['ratio']:.2f}" if "ratio" in r else ""
  return f"cold build of {shape}, each alone: {ours}; {theirs}{ratio}"


# Issue 44's must-show figures: ours (default, no variant) over torch.compile at each shape,
# MFU (datasheet) at Large 128, the matmul within 5%.
MUST_RATIO = {("base", 128, 256): 1.2, ("large", 128, 256): 1.1, ("large", 512, 64): 1.1}
MUST_MFU = 0.42


def must_show(records: Sequence[dict[str, Any]]) -> list[str]:
  """Issue 44's must-show figures from this run's records, each with its threshold and
  whether this run met it, or "not taken"."""
  steps = [r for r in records if r.get("kind") == "step" and not r.get("variant")]
  built = {r["id"]: r for r in records if r.get("kind") == "built"}

  def find(impl: str, size: str, seq: int, batch: int) -> dict[str, Any] | None:
    return next((r for r in steps if r["impl"] == impl and r["task"] == "pretrain"
                 and (r["size"], r["seq"], r["batch"]) == (size, seq, batch)), None)  # fmt: skip

  def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"

  lines = ["must-show (issue 44), default configuration of ours, dropout 0.1 both sides:"]
  for (size, seq, batch), need in MUST_RATIO.items():
    o, t = find("bert_jax", size, seq, batch), find("torch_compile", size, seq, batch)
    e = find("torch", size, seq, batch)
    if o and t:
      ratio = o["tokens_per_s"] / t["tokens_per_s"]
      eager = f", eager {e['seq_per_s']:,.0f}" if e else ""
      lines.append(
        f"1. {size} {seq} x {batch}: ours {o['seq_per_s']:,.0f} seq/s, torch.compile "
        f"{t['seq_per_s']:,.0f}{eager}: {ratio:.2f}x (at least {need}x: {verdict(ratio >= need)})"
      )
    else:
      lines.append(f"1. {size} {seq} x {batch}: not taken")
  o, t = find("bert_jax", "large", 128, 256), find("torch_compile", "large", 128, 256)
  if o and o.get("mfu_datasheet") is not None:
    tc = f" (torch.compile {t['mfu_datasheet']:.1%})" if t and t.get("mfu_datasheet") else ""
    ok = verdict(o["mfu_datasheet"] >= MUST_MFU)
    lines.append(f"2. MFU at large 128 x 256: {o['mfu_datasheet']:.1%}{tc} (at least 42%: {ok})")
  else:
    lines.append("2. MFU (datasheet) at large 128 x 256: not taken")
  o, t = find("bert_jax", "large", 512, 64), find("torch_compile", "large", 512, 64)
  mem = built.get(o["id"], {}).get("mem_gib") if o else None
  if mem is not None and t and t.get("mem_gib") is not None:
    ok = verdict(mem <= t["mem_gib"])
    lines.append(
      f"2. step memory at large 512 x 64: ours {mem:.1f} GiB, torch.compile "
      f"{t['mem_gib']:.1f} GiB (at most torch.compile's: {ok})"
    )
  else:
    lines.append("2. step memory at large 512 x 64: not taken")
  gemm = next((r for r in records if r.get("kind") == "gemm"), None)
  if gemm and gemm.get("chain_ratio") is None:
    lines.append(
      f"3. bf16 matmul: one call only (ours / PyTorch {gemm['call_ratio']:.3f}); the chain of "
      "products not taken"
    )
  elif gemm:
    gap = "; ".join(f"{s['size']} {s['seq']}: {s['gap_ms']:.1f} of {s['step_device_ms']:.1f} ms"
                    for s in gemm.get("steps", []))  # fmt: skip
    lines.append(
      f"3. bf16 matmul, chain of products: ours / PyTorch {gemm['chain_ratio']:.3f} "
      f"(within 5%: {verdict(gemm['within_5pct'])}; one call {gemm['call_ratio']:.3f})"
      + (f"; the gap in our profiled steps' GEMMs: {gap}" if gap else "")
    )
  else:
    lines.append("3. bf16 matmul against PyTorch's: not taken")
  alone = next((r for r in records if r.get("kind") == "compile_alone"), None)
  if alone and "ratio" in alone:
    lines.append(
      f"5. cold build of {alone['size']} {alone['seq']} x {alone['batch']}, each alone: ours "
      f"{alone['ours_build_s']:.0f} s, {alone['torch_impl']} {alone['torch_compile_s']:.0f} s "
      f"(no slower: {verdict(alone['ratio'] <= 1.0)})"
    )
  else:
    lines.append("5. cold build of large 128 x 256, each alone: not taken")
  return lines


def ours_argv(spec: dict[str, Any]) -> list[str]:
  """Our GPU-session worker: this CLI's `--gpu_worker` in a fresh interpreter."""
  argv = [sys.executable, "-m", "bert_jax.benchmark", "--gpu_worker=" + json.dumps(spec)]
  return argv + compile_cache.child_args()
