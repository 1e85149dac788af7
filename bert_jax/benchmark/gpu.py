"""The GPU comparison (`python -m bert_jax.benchmark --gpu`): our train steps against
transformers' PyTorch BERT on the same GPU, in one command that ends within `--deadline`.

Ours is the trainer's jitted pretraining step (`step.py`) and the fine-tuning engine's step
(`finetune_step.py`), bf16 compute with float32 params, at each shape, and its variants (model
fields, XLA options). The peers are transformers' BertForPreTraining /
BertForSequenceClassification, eager and torch.compile, SDPA attention, bf16 autocast, fused
AdamW, clipping at 1.0, dropout 0.1 (or a peer variant's), on the same batch (15% of positions
masked). What runs is planned first (`gpu_plan.py`: priority order, estimates, what fits).
Two worker processes, ours (`gpu_ours.py`) and PyTorch's (`peer_worker.gpu_session`), build
and compile everything in parallel; then, with no compile running anywhere, PyTorch's worker
times its steps and exits (freeing its memory), then ours times its steps and traces the
profiled ones (`profile.py`). A worker starts a variant's build only if it still fits before
the build deadline (the deadline less the planned timing phase), and always builds a shape.

MFU counts the same model FLOPs for every implementation (`sizes.standard_flops_per_token`:
every layer at every position, the MLM head at the masked positions) against two peaks: the
datasheet's dense bf16 for the device kind, and a bf16 matmul with a bf16 result measured in
the same process (as PyTorch's `a @ a` is; ours also reports its float32-result matmul).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from bert_jax import compile_cache
from bert_jax.benchmark import gpu_plan, lockstep, peers, profile, sizes, suite, tables

# Past the deadline, a build that had to start (a shape) may still be running: the parent waits
# this long for its workers before it stops them (tools/gpu/device_run.sh's hard timeout is
# the deadline + this + a margin).
GRACE_S = 45.0
# Dense bf16 TFLOP/s by device kind (substring of the kind JAX or PyTorch reports, first match).
DATASHEET_BF16_TFLOPS = (
  ("H200", 989.0),
  ("H100 PCIe", 756.0),
  ("H100", 989.0),  # SXM
  ("A100", 312.0),
)


def datasheet_tflops(device_kind: str) -> float | None:
  """The dense bf16 datasheet peak of a device kind, or None (not in the table)."""
  for key, tflops in DATASHEET_BF16_TFLOPS:
    if key.lower() in device_kind.lower():
      return tflops
  return None


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
) -> list[dict[str, Any]]:
  """The whole comparison; returns every record (also emitted as JSON lines as they come).
  `dry_run`: only the plan (`gpu_plan.format_plan`). `prepare_delay_s` slows our worker's
  preparation of each plan by that much (the tests' stand-in for a loaded host)."""
  t0 = time.time()
  end_by = t0 + deadline_s
  plans = gpu_plan.make_plans(smoke, variants, torch_modes, shapes, profile)
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
  # Our variants left out wait on standby (built and timed only if time is left over), when
  # our worker runs at all.
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
  }
  peaks: dict[str, dict[str, float]] = {"ours": {}, "torch": {}}

  def on_record(rec: dict[str, Any]) -> None:
    side = rec.get("side", "")
    if rec["kind"] == "env":
      peaks[side]["datasheet"] = datasheet_tflops(rec.get("device_kind", ""))
    elif rec["kind"] == "peak":
      peaks[side]["measured_peak"] = rec["tflops"]
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
      spec.update(profile_dir=profile_dir, prepare_delay_s=prepare_delay_s)
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

  def ready(side: str, w: lockstep.LockstepWorker) -> None:
    try:
      w.wait_ready(max(1.0, end_by + GRACE_S - time.time()))
    except RuntimeError as e:
      emit({"kind": "error", "side": side, "error": str(e)[-500:]})
      w.close()

  threads = [threading.Thread(target=ready, args=item) for item in workers.items()]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  # PyTorch first: its worker then exits and frees its memory for ours, which cannot free its
  # (JAX keeps its pool), so the largest of our steps runs with the whole device.
  for side in ("torch", "ours"):
    w = workers.get(side)
    if w is None or w.proc.poll() is not None:
      continue
    try:
      w.finish("time", max(1.0, end_by + GRACE_S - time.time()))
    except RuntimeError as e:
      emit({"kind": "error", "side": side, "error": str(e)[-500:]})
    finally:
      w.close()
  emit({"kind": "gpu_done", "wall_s": time.time() - t0, "deadline_s": deadline_s})
  return records


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
      f"{side}: {r.get('device_kind', '?')} ({what}); bf16 matmul {_fmt(pk.get('tflops'), '.3g')} "
      f"TFLOP/s measured (bf16 result{f32}), datasheet {_fmt(sheet, '.0f')}"
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
      mem = b.get("mem_gib")
    else:  # torch.compile compiles inside its first call
      comp = _fmt(r["first_step_s"] - r["step_s"], ".0f") if r["impl"] == "torch_compile" else "-"
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
  for r in records:
    if r.get("kind") == "profile":
      lines += ["", profile.format_profile(r)]
  return "\n".join(lines)


def ours_argv(spec: dict[str, Any]) -> list[str]:
  """Our GPU-session worker: this CLI's `--gpu_worker` in a fresh interpreter."""
  argv = [sys.executable, "-m", "bert_jax.benchmark", "--gpu_worker=" + json.dumps(spec)]
  return argv + compile_cache.child_args()
