"""The GPU comparison (`python -m bert_jax.benchmark --gpu`): our train steps against
transformers' PyTorch BERT on the same GPU, in one command that ends within `--deadline`.

Ours is the trainer's jitted pretraining step (`step.py`) and the fine-tuning engine's step
(`finetune_step.py`), bf16 compute with float32 params, in each planned shape and model-field
variant. The peers are transformers' BertForPreTraining / BertForSequenceClassification, eager
and torch.compile, SDPA attention, bf16 autocast, fused AdamW, clipping at 1.0, dropout 0.1, on
the same batch (15% of positions masked). Two worker processes, ours (`gpu_ours.py`) and
PyTorch's (`peer_worker.gpu_session`), build and compile everything in parallel; then, with no
compile running anywhere, PyTorch's worker times its steps and exits (freeing its memory), then
ours times its steps. Each plan carries estimates of its compile and step times (measured on an
H200 on 2026-11-26, docs/gpu.md): a worker starts a build only if it fits before the build
deadline (the deadline less the estimated timing phase) and times a step only if it fits
before the deadline; whatever is skipped is reported as such.

MFU counts the same model FLOPs for every implementation (`sizes.standard_flops_per_token`:
every layer at every position, the MLM head at the masked positions) against two peaks: the
datasheet's dense bf16 for the device kind, and a bf16 matmul measured in the same process.
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
from bert_jax.benchmark import lockstep, peers, sizes, suite, tables

# Dense bf16 TFLOP/s by device kind (substring of the kind JAX or PyTorch reports, first match).
DATASHEET_BF16_TFLOPS = (
  ("H200", 989.0),
  ("H100 PCIe", 756.0),
  ("H100", 989.0),  # SXM
  ("A100", 312.0),
)

# The shapes compared: (task, size, seq, batch). BERT's pretraining phases (128 x 256, then
# 512) at Base and Large, and a fine-tuning step at the paper's batch 32.
SHAPES = (
  ("pretrain", "base", 128, 256),
  ("pretrain", "large", 128, 256),
  ("pretrain", "large", 512, 64),
  ("finetune", "base", 128, 32),
)
SMOKE_SHAPES = (
  ("pretrain", "tiny", 128, 8),
  ("pretrain", "tiny", 64, 4),
  ("finetune", "tiny", 128, 8),
)
# Our variants (model fields; `task`, `size`, `seq`, `batch` pick the shape, default the first
# of SHAPES): the dropout generator, the fused attention kernels (which need attention dropout
# off), and scanned against unrolled layers at both sizes (compile time against step time).
VARIANTS = (
  "dropout_rng=rbg;"
  "attention_dropout_prob=0.0,attention_impl=xla;"
  "attention_dropout_prob=0.0,attention_impl=cudnn;"
  "scan_layers=True;"
  "size=large,scan_layers=True"
)
SMOKE_VARIANTS = "hidden_dropout_prob=0.0;scan_layers=True"
SHAPE_KEYS = ("task", "size", "seq", "batch")

# Estimates from the H200 run of 2026-11-26 (NOTES: compile 75-89 s Base, 133-137 s Large for
# ours; 27-73 s torch.compile; steps 187 ms Base ours, 63.5 ms Base torch.compile), rounded up.
# Keys: (task, size, seq); a shape not listed scales Base's by its layers.
EST_COMPILE_S = {
  "ours": {
    ("pretrain", "base", 128): 90,
    ("pretrain", "large", 128): 140,
    ("pretrain", "large", 512): 140,
    ("finetune", "base", 128): 80,
  },
  "compile": {
    ("pretrain", "base", 128): 30,
    ("pretrain", "large", 128): 50,
    ("pretrain", "large", 512): 75,
    ("finetune", "base", 128): 30,
  },
  "eager": {},
}
EST_STEP_S = {
  "ours": {
    ("pretrain", "base", 128): 0.20,
    ("pretrain", "large", 128): 0.30,
    ("pretrain", "large", 512): 0.40,
    ("finetune", "base", 128): 0.04,
  },
  "compile": {
    ("pretrain", "base", 128): 0.07,
    ("pretrain", "large", 128): 0.17,
    ("pretrain", "large", 512): 0.19,
    ("finetune", "base", 128): 0.02,
  },
  "eager": {
    ("pretrain", "base", 128): 0.10,
    ("pretrain", "large", 128): 0.22,
    ("pretrain", "large", 512): 0.23,
    ("finetune", "base", 128): 0.03,
  },
}
EAGER_BUILD_S = 15  # model on the device + the first steps
SCAN_COMPILE = 0.35  # scanned layers compile one layer body: a share of the unrolled time
SMOKE_COMPILE_S, SMOKE_STEP_S = 20.0, 0.05  # the CPU smoke run's (tiny) estimates
# Seconds a worker spends around its timing phase (matmul peak, exit), and the parent's margin.
SIDE_OVERHEAD_S, MARGIN_S = 15.0, 10.0


def datasheet_tflops(device_kind: str) -> float | None:
  """The dense bf16 datasheet peak of a device kind, or None (not in the table)."""
  for key, tflops in DATASHEET_BF16_TFLOPS:
    if key.lower() in device_kind.lower():
      return tflops
  return None


def estimates(side: str, task: str, size: str, seq: int, variant: dict, smoke: bool):
  """(compile or build seconds, step seconds) expected of a plan; `side` is "ours", "eager"
  or "compile"."""
  if smoke:
    return SMOKE_COMPILE_S, SMOKE_STEP_S
  key = (task, size, seq)
  n_layers = sizes.size_fields(size)["num_layers"]
  base = ("pretrain", "base", 128)
  scale = n_layers / 12 * seq / 128
  step_s = EST_STEP_S[side].get(key, EST_STEP_S[side][base] * scale)
  if side == "eager":
    return EAGER_BUILD_S, step_s
  compile_s = EST_COMPILE_S[side].get(key, EST_COMPILE_S[side][base] * n_layers / 12)
  if variant.get("scan_layers") in (True, "True"):
    compile_s *= SCAN_COMPILE
  return compile_s, step_s


def _shape(fields: dict[str, Any], default: Sequence[Any]) -> dict[str, Any]:
  """A variant's shape keys (task, size, seq, batch), the default shape's where absent."""
  shape = dict(zip(SHAPE_KEYS, default, strict=True))
  for k in SHAPE_KEYS:
    if k in fields:
      shape[k] = type(shape[k])(fields.pop(k))
  if shape["task"] not in peers.TASKS:
    raise ValueError(f"--variants task={shape['task']!r}: use one of {', '.join(peers.TASKS)}")
  sizes.size_fields(shape["size"])  # an unknown size: one line
  return shape


def make_plans(
  smoke: bool = False,
  variants: Sequence[dict[str, Any]] | None = None,
  torch_modes: Sequence[str] = ("eager", "compile"),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
  """(ours, torch) plans in priority order: the shapes with the trainer's default model, then
  our variants (model-field overrides; `task`/`size`/`seq`/`batch` keys move a variant to that
  shape); PyTorch's eager steps first (cheap), then its torch.compile'd ones."""
  shapes = SMOKE_SHAPES if smoke else SHAPES
  if variants is None:
    variants = suite.parse_variants(SMOKE_VARIANTS if smoke else VARIANTS)
  entries = [(dict(zip(SHAPE_KEYS, s, strict=True)), {}) for s in shapes]
  for v in variants:
    fields = dict(v)
    entries.append((_shape(fields, shapes[0]), fields))
  ours: list[dict[str, Any]] = []
  for shape, fields in entries:
    est_compile, est_step = estimates("ours", **_key(shape), variant=fields, smoke=smoke)
    ours.append(
      {
        "id": f"ours{len(ours)}",
        "side": "ours",
        "impl": "bert_jax",
        **shape,
        "variant": fields,
        "est_compile_s": est_compile,
        "est_step_s": est_step,
        "est_mem": _mem_key(shape),
      }
    )
  torch_plans = []
  for mode in torch_modes:
    if mode not in ("eager", "compile"):
      raise ValueError(f"--torch_modes: unknown mode {mode!r}; use eager, compile")
    for task, size, seq, batch in shapes:
      shape = {"task": task, "size": size, "seq": seq, "batch": batch}
      est_compile, est_step = estimates(mode, task, size, seq, {}, smoke)
      framework = "torch_compile" if mode == "compile" else "torch"
      torch_plans.append(
        {
          **peers.peer_spec(framework, "bfloat16", size, seq, batch, task),
          "id": f"torch{len(torch_plans)}",
          "side": "torch",
          "impl": framework,
          "mode": mode,
          "variant": {},
          "attn": "sdpa",
          "clip_norm": 1.0,
          "est_compile_s": est_compile,
          "est_step_s": est_step,
          "est_mem": _mem_key(shape),
        }
      )
  return ours, torch_plans


def _key(shape: dict[str, Any]) -> dict[str, Any]:
  return {"task": shape["task"], "size": shape["size"], "seq": shape["seq"]}


def _mem_key(shape: dict[str, Any]) -> int:
  """An order of the plans' step memory (activations ~ tokens x layers x hidden)."""
  f = sizes.size_fields(shape["size"])
  return shape["batch"] * shape["seq"] * f["num_layers"] * f["hidden_size"]


def timing_reserve(plans: Sequence[dict[str, Any]], steps: int, reps: int, warmup: int) -> float:
  """Seconds the timing phase takes if every plan is built: each step's warm-up (ours; the
  peers warm up while building) and timed steps, each side's overhead, the parent's margin."""
  total = MARGIN_S + SIDE_OVERHEAD_S * len({p["side"] for p in plans})
  for p in plans:
    total += p["est_step_s"] * (steps * reps + (warmup if p["side"] == "ours" else 0))
  return total


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
) -> list[dict[str, Any]]:
  """The whole comparison; returns every record (also emitted as JSON lines as they come)."""
  t0 = time.time()
  end_by = t0 + deadline_s
  ours, torch_plans = make_plans(smoke, variants, torch_modes)
  records: list[dict[str, Any]] = []
  lock = threading.Lock()

  def emit(rec: dict[str, Any]) -> None:
    with lock:
      rec = {**rec, "t_s": round(time.time() - t0, 1)}
      records.append(rec)
      suite.emit(rec, json_out)

  if torch_plans and not peers.peer_available(peer_python)["torch"]:
    emit(
      {
        "kind": "note",
        "side": "torch",
        "note": f"torch/transformers not importable in {peer_python}: no peers",
      }
    )
    torch_plans = []
  plans = ours + torch_plans
  reserve = timing_reserve(plans, steps, reps, warmup)
  build_until = end_by - reserve
  emit(
    {
      "kind": "gpu_plan",
      "smoke": smoke,
      "deadline_s": deadline_s,
      "build_s": build_until - t0,
      "timing_reserve_s": reserve,
      "plans": plans,
    }
  )
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
    elif rec["kind"] == "step":
      rec = enrich(rec, peaks[side])
    emit(rec)

  grace = 90.0  # past the deadline: compiles that started in time may still be running
  workers: dict[str, lockstep.LockstepWorker] = {}
  specs = {"ours": ours, "torch": torch_plans}
  for side, side_plans in specs.items():
    if not side_plans:
      continue
    spec = {**common, "plans": side_plans}
    argv = ours_argv(spec) if side == "ours" else peers.peer_argv(peer_python, spec)
    workers[side] = lockstep.LockstepWorker(
      f"gpu-{side}",
      argv,
      deadline_s + grace,
      env=_worker_env(side, smoke),
      wait=False,
      on_record=on_record,
    )

  def ready(side: str, w: lockstep.LockstepWorker) -> None:
    try:
      w.wait_ready(max(1.0, end_by + grace - time.time()))
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
      w.finish("time", max(1.0, end_by + grace - time.time()))
    except RuntimeError as e:
      emit({"kind": "error", "side": side, "error": str(e)[-500:]})
    finally:
      w.close()
  emit({"kind": "gpu_done", "wall_s": time.time() - t0, "deadline_s": deadline_s})
  return records


def _index(plan_id: str) -> int:
  """A plan's position in its side's list ("ours3" -> 3)."""
  return int("".join(c for c in plan_id if c.isdigit()) or 0)


def _fmt(x: Any, spec: str) -> str:
  return "-" if x is None else format(x, spec)


def format_gpu_table(records: Sequence[dict[str, Any]]) -> str:
  """The comparison: one row per timed step, then what was skipped or failed."""
  env = {r["side"]: r for r in records if r.get("kind") == "env"}
  peak = {r["side"]: r["tflops"] for r in records if r.get("kind") == "peak"}
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
    lines.append(
      f"{side}: {r.get('device_kind', '?')} ({what}); bf16 matmul {_fmt(peak.get(side), '.3g')} "
      f"TFLOP/s measured, datasheet {_fmt(sheet, '.0f')}"
    )
  compiled = {
    (r["task"], r["size"], r["seq"], r["batch"]): r["tokens_per_s"]
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
    ref = compiled.get((r["task"], r["size"], r["seq"], r["batch"]))
    lines.append(
      f"| {r['task']} | {r['size']} | {r['seq']} x {r['batch']} | {r['impl']} | {var} | "
      f"{r['seq_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | {1e3 * r['step_s']:.1f} | "
      f"{_fmt(r.get('mfu_datasheet'), '.1%')} | {_fmt(r.get('mfu_measured_peak'), '.1%')} | "
      f"{_fmt(mem, '.1f')} | {comp} | {_fmt(ref and r['tokens_per_s'] / ref, '.2f')} |"
    )
  for r in records:
    if r.get("kind") in ("skipped", "error"):
      what = " ".join(str(r[k]) for k in ("side", "impl", "task", "size", "seq", "batch") if k in r)
      var = ",".join(f"{k}={v}" for k, v in r.get("variant", {}).items())
      why = r.get("why") or r.get("error")
      lines.append(f"{r['kind']}: {what} {var} - {why}".replace("  ", " "))
  done = [r for r in records if r.get("kind") == "gpu_done"]
  if done:
    lines.append(f"wall {done[-1]['wall_s']:.0f} s (deadline {done[-1]['deadline_s']:.0f} s)")
  return "\n".join(lines)


def ours_argv(spec: dict[str, Any]) -> list[str]:
  """Our GPU-session worker: this CLI's `--gpu_worker` in a fresh interpreter."""
  argv = [sys.executable, "-m", "bert_jax.benchmark", "--gpu_worker=" + json.dumps(spec)]
  return argv + compile_cache.child_args()
