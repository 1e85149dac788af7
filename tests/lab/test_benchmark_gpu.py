"""bert_jax.benchmark's GPU comparison (`--gpu`), run here on the CPU: the plan and its
admission against the deadline, our worker's build and timing phases, the matmul peaks, the
profile parser on a traced CPU step and on GPU-shaped events, the smoke run of both workers."""

import dataclasses
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax.benchmark import (
  gpu,
  gpu_ours,
  gpu_plan,
  kernel_families,
  peers,
  protocol,
  sizes,
  step,
  suite,
)
from bert_jax.benchmark import profile as benchmark_profile

PACKAGE = pathlib.Path(step.__file__).parent
REPO = PACKAGE.parents[1]
DEVICE_RUN = REPO / "tools" / "gpu" / "device_run.sh"
RUNS = REPO / "docs" / "gpu-runs" / "2026-11-28-h200"


def _peer_python() -> str | None:
  """An interpreter with torch and transformers: $BERT_JAX_PEER_PYTHON, or this one."""
  python = os.environ.get("BERT_JAX_PEER_PYTHON", sys.executable)
  return python if peers.peer_available(python)["torch"] else None


# ----------------------------------------------------------------------------- --gpu


def test_standard_flops_and_mfu_against_a_hand_count():
  # BERT-Base at 128: per layer 6 (4 d^2 + 2 d f) + 12 d L, 12 layers; MLM head (dense 768^2 and
  # the tied 768 x 30522 decoder) at 20 masked positions of 128; pooler + NSP once a sequence.
  per_layer = 6 * (4 * 768**2 + 2 * 768 * 3072) + 12 * 768 * 128
  assert per_layer == 43_646_976
  head = 6 * (768**2 + 768 * 30522) * 20 / 128
  pooler = 6 * (768**2 + 2 * 768) / 128
  assert 12 * per_layer + head + pooler == 546_320_232
  assert sizes.standard_flops_per_token("base", 128) == 546_320_232
  # The pruned last layer is not credited: the same count as an unpruned model.
  cfg = model_config.config_for_size("base")
  assert sizes.standard_flops_per_token("base", 128) > model_lib.train_flops_per_token(cfg, 128, 20)
  # NOTES-gpu.md's Base row: 1,154 sequences/s is 8% of an H200's 989 TFLOP/s.
  rec = dict(task="pretrain", size="base", seq=128, batch=256, step_s=256 / 1154)
  peaks = {"datasheet": 989.0, "measured_peak": 747.0, "measured_peak_f32out": 677.0}
  out = gpu.enrich(rec, peaks)
  assert out["seq_per_s"] == pytest.approx(1154) and out["tokens_per_s"] == pytest.approx(147_712)
  assert out["tflops"] == pytest.approx(147_712 * 546_320_232 / 1e12)
  assert out["mfu_datasheet"] == pytest.approx(0.0816, abs=5e-4)
  # Against the bf16-result matmul (as PyTorch's), and ours' float32-result one beside it.
  assert out["mfu_measured_peak"] == pytest.approx(out["tflops"] / 747.0)
  assert out["mfu_measured_peak_f32out"] == pytest.approx(out["tflops"] / 677.0)
  assert "mfu_datasheet" not in gpu.enrich(rec, {"datasheet": None})
  # Fine-tuning: the encoder at every position, pooler + 2-way classifier, no MLM head.
  ft = sizes.standard_flops_per_token("base", 128, "finetune")
  assert ft == 12 * per_layer + 6 * 768**2 / 128 + 6 * 768 * 2 / 128  # pooler, classifier


def test_datasheet_peaks_by_device_kind():
  assert gpu.datasheet_tflops("NVIDIA H200") == 989
  assert gpu.datasheet_tflops("NVIDIA H100 80GB HBM3") == 989
  assert gpu.datasheet_tflops("NVIDIA H100 PCIe") == 756
  assert gpu.datasheet_tflops("NVIDIA A100-SXM4-80GB") == 312
  assert gpu.datasheet_tflops("cpu") is None


def test_our_matmul_one_call_and_a_chain_of_products(capsys):
  f = gpu_ours._matmuls(64, chain=4)
  x, b = f["chain"][1]
  # The chain is x @ b four times over (bf16 results), not one product hoisted or merged.
  want = np.asarray(x, np.float64)
  for _ in range(4):
    want = want @ np.asarray(b, np.float64)
  got = np.asarray(f["chain"][0](x, b), np.float64)
  assert f["chain"][0](x, b).dtype == jnp.bfloat16
  assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2
  assert 0.5 < np.linalg.norm(want) / np.linalg.norm(np.asarray(x, np.float64)) < 2  # b ~ 1/sqrt(n)
  assert f["bf16"][0](x).dtype == jnp.bfloat16 and f["f32out"][0](x).dtype == jnp.float32
  gpu_ours._peaks(f, chain=4)
  (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith(protocol.RECORD_MARK)]
  rec = json.loads(line[len(protocol.RECORD_MARK) :])
  assert rec["kind"] == "peak" and rec["matmul_n"] == 64 and rec["chain_products"] == 4
  assert rec["tflops"] > 0 and rec["tflops_f32out"] > 0 and rec["tflops_chain"] > 0
  assert rec["gemm_backend"] == "XLA"  # XLA:CPU's own dot
  hlo = 'custom-call(...), custom_call_target="__cublas$lt$matmul"'
  assert gpu_ours.gemm_backend(hlo) == "cublasLt"
  assert gpu_ours.gemm_backend(hlo + ' kind=kCustom, "__triton_gemm"') == "cublasLt,Triton"


def test_gpu_plans_shapes_profiles_alone_and_variants():
  plans = gpu_plan.make_plans()
  ours = [p for p in plans if p["side"] == "ours" and p["role"] == "shape"]
  torch_plans = [p for p in plans if p["side"] == "torch" and p["role"] == "shape"]
  shapes = [gpu_plan.SHAPES[n] for n in gpu_plan.DEFAULT_SHAPES]
  assert [(p["task"], p["size"], p["seq"], p["batch"]) for p in ours] == shapes
  assert [(p["impl"], p["task"], p["size"], p["seq"], p["batch"]) for p in torch_plans] == [
    (impl, *shape) for impl in ("torch", "torch_compile") for shape in shapes
  ]
  for p in torch_plans:  # the peer's recipe: SDPA, bf16 autocast, clipping, dropout 0.1
    assert (p["attn"], p["dtype"], p["clip_norm"], p["dropout"], p["attention_dropout"]) == (
      "sdpa", "bfloat16", 1.0, 0.1, 0.1
    )  # fmt: skip
  # Large 128 x 256 is built alone on each side: ours, and torch.compile's (not eager's), with
  # the estimates of a build alone.
  alone = [p for p in plans if p.get("alone")]
  assert [(p["impl"], p["size"], p["seq"]) for p in alone] == [
    ("bert_jax", "large", 128), ("torch_compile", "large", 128)
  ]  # fmt: skip
  assert [p["est_compile_s"] for p in alone] == [
    gpu_plan.EST_BUILD_S["ours_alone"][("pretrain", "large", 128)],
    gpu_plan.EST_BUILD_S["compile_alone"][("pretrain", "large", 128)],
  ]
  # The profiles: ours and torch.compile's step at Base 128 and at Large 512, after the shapes.
  profs = [p for p in plans if p["role"] == "profile"]
  by_id = {p["id"]: p for p in plans}
  assert [(p["side"], by_id[p["of"]]["impl"], p["size"], p["seq"]) for p in profs] == [
    ("ours", "bert_jax", "base", 128), ("torch", "torch_compile", "base", 128),
    ("ours", "bert_jax", "large", 512), ("torch", "torch_compile", "large", 512),
  ]  # fmt: skip
  assert [p["priority"] for p in profs] == list(range(9, 13))
  variants = [p for p in plans if p["role"] == "variant"]
  assert [p["priority"] for p in plans] == list(range(len(plans)))
  assert len({p["id"] for p in plans}) == len(plans)
  # The old GPU default first (every run A/Bs it), then XLA's GEMM options; no variant of a
  # model choice that left the model; the default model is whatever `auto` resolves to.
  assert [p["variant"] for p in variants[:3]] == [
    {"dropout_rng": "threefry", "attention_impl": "explicit"},
    {"xla_gpu_enable_triton_gemm": False},
    {"xla_gpu_enable_cublaslt": True},
  ]
  assert all(p["variant"] == {} for p in ours)
  removed = {("dropout_rng", "rbg"), ("dropout_rng", "hash_redraw"), ("kernels", "lowp")}
  assert not removed & {(k, v) for p in variants for k, v in p["variant"].items()}
  cudnn, peer = [p for p in variants if p["variant"].get("attention_dropout_prob") == 0]
  assert cudnn["variant"]["attention_impl"] == "cudnn" and peer["side"] == "torch"
  # The PyTorch peer at the same setting: attention dropout 0, hidden 0.1, torch.compile; it
  # is admitted only with the variant of ours listed before it.
  assert (peer["impl"], peer["attention_dropout"], peer["dropout"]) == ("torch_compile", 0.0, 0.1)
  assert peer["with"] == cudnn["id"]
  assert variants[-1]["size"] == "large" and variants[-1]["variant"] == {"scan_layers": True}
  # Scanned layers compile one body: a smaller estimate than the unrolled model's.
  assert variants[-1]["est_compile_s"] < gpu_plan.EST_BUILD_S["ours"][("pretrain", "large", 128)]
  # --variants= means none; --shapes picks the shapes; --profile= none; ours alone; no alone
  # build where its shape is not among --shapes.
  plans = gpu_plan.make_plans(variants=[], torch_modes=[], shapes=["large512"], profile=[])
  assert [(p["side"], p["role"], p["size"], p["seq"], p.get("alone")) for p in plans] == [
    ("ours", "shape", "large", 512, None)
  ]
  assert suite.parse_variants("") == []
  plans = gpu_plan.make_plans(variants=[{"task": "finetune", "seq": "64"}], torch_modes=[])
  assert (plans[-1]["task"], plans[-1]["seq"], plans[-1]["variant"]) == ("finetune", 64, {})
  # Eager only: its plan is the alone one on the PyTorch side, and the profiled one.
  plans = gpu_plan.make_plans(torch_modes=["eager"], variants=[], shapes=["large128"])
  assert [(p["side"], p["impl"]) for p in plans if p.get("alone")] == [
    ("ours", "bert_jax"), ("torch", "torch")
  ]  # fmt: skip
  assert gpu_plan.make_plans(variants=[], shapes=["base128"], alone="")[0].get("alone") is None
  with pytest.raises(ValueError, match="unknown size 'huge'"):
    gpu_plan.make_plans(variants=[{"size": "huge"}])
  with pytest.raises(ValueError, match="unknown mode 'jit'"):
    gpu_plan.make_plans(torch_modes=["jit"])
  with pytest.raises(ValueError, match="unknown shape 'base999'"):
    gpu_plan.make_plans(shapes=["base999"])
  with pytest.raises(ValueError, match="side=torch: scan_layers not one of"):
    gpu_plan.make_plans(variants=[{"side": "torch", "scan_layers": True}])
  with pytest.raises(ValueError, match="--compile_alone: 'large128' is not one of --shapes"):
    gpu_plan.make_plans(shapes=["base128"], alone="large128")


def _device_run_limits() -> tuple[float, float]:
  """(the benchmark's --deadline, its hard timeout) in tools/gpu/device_run.sh."""
  text = DEVICE_RUN.read_text()
  (deadline,) = re.findall(r"--deadline=(\d+)", text)
  (timeout,) = re.findall(r'timeout (\d+) "\$PYTHON" -m bert_jax.benchmark --gpu', text)
  return float(deadline), float(timeout)


def test_the_h200_plan_fits_nine_minutes_and_takes_every_must_show():
  """tools/gpu/device_run.sh's plan on the H200 estimates: both alone builds first, every
  shape on both sides and the four profiles admitted, the variants fill what is left in their
  order (the old default first), and the command (the deadline, the parent's grace, the
  set-up around it) stays under 9 minutes."""
  deadline, timeout = _device_run_limits()
  assert deadline + gpu.GRACE_S + 5 <= timeout and timeout + 15 <= 9 * 60
  plans = gpu_plan.make_plans()
  taken, left, sim = gpu_plan.admit(plans, deadline, steps=10, reps=3, warmup=3, compile_threads=3)
  assert sim["end_s"] <= deadline
  assert all(p["role"] == "variant" for p in left)
  assert {p["id"] for p in plans if p["role"] != "variant"} <= {p["id"] for p in taken}
  admitted = [p["variant"] for p in taken if p["role"] == "variant" and p["side"] == "ours"]
  assert admitted[:2] == [{"dropout_rng": "threefry", "attention_impl": "explicit"},
                          {"xla_gpu_enable_triton_gemm": False}]  # fmt: skip
  # The alone builds, ours then torch.compile's, each before any other build starts.
  ours_alone, torch_alone = [sim["at"][p["id"]] for p in plans if p.get("alone")]
  assert ours_alone[1] <= torch_alone[0] and torch_alone[1] == sim["alone_end_s"]
  others = [sim["at"][p["id"]] for p in taken if p["role"] != "profile" and not p.get("alone")]
  assert min(start for start, _ in others) >= sim["alone_end_s"]
  # Then ours start with the longest compile (Large 512), the variants after the shapes.
  order = gpu_plan.build_order(taken)
  assert [(p["size"], p["seq"]) for p in order[:2]] == [("large", 512), ("base", 128)]
  assert all(p["role"] == "variant" for p in order[2:])
  # A tight deadline leaves out variants, never a shape, and a profile only with its step.
  taken, left, _ = gpu_plan.admit(plans, 430, steps=10, reps=3, warmup=3, compile_threads=3)
  assert {p["role"] for p in left} <= {"variant", "profile"}
  assert [p["role"] for p in taken if p["side"] == "ours"][:3] == ["shape"] * 3
  taken, left, _ = gpu_plan.admit(plans, 0, steps=10, reps=3, warmup=3, compile_threads=3)
  assert taken == [] and len(left) == len(plans)


def _replay(gate, order, seconds, threads=2, t0=0.0, lower_s=1.0):
  """Our worker's build phase (`gpu_ours.build`) on a simulated clock: each plan waits for a
  free compile thread, asks the gate, is lowered on the main thread (`lower_s`) and compiled
  for `seconds[id]`. Returns ({id: (start, end)} of the builds started, [ids skipped])."""
  t, running, at, skipped = t0, {}, {}, []

  def finish_until(now):
    for pid, end in sorted(running.items(), key=lambda kv: kv[1]):
      if end <= now:
        gate.done(next(p for p in order if p["id"] == pid), end - at[pid][0])
        del running[pid]

  for plan in order:
    finish_until(t)
    if len(running) >= threads:
      t = max(t, min(running.values()))
      finish_until(t)
    if not gate.try_start(plan, t):
      skipped.append(plan["id"])
      continue
    start, t = t, t + lower_s
    running[plan["id"]] = t + seconds[plan["id"]]
    at[plan["id"]] = (start, running[plan["id"]])
  finish_until(float("inf"))
  return at, skipped


def _gate_plans():
  # Two shapes (est 50 s), three variants (est 40 s) and a short one (est 10 s), 10-step
  # timings of 0.1 s: each plan owes 2.5 + 0.1 * 33 = 5.8 s of timing.
  plans = [_plan(0, "shape", est=50.0), _plan(1, "shape", est=50.0)]
  plans += [_plan(i, "variant", est=40.0) for i in (2, 3, 4)] + [_plan(5, "variant", est=10.0)]
  for p in plans:
    p["est_step_s"] = 0.1
  return plans


def test_build_gate_starts_standby_variants_whenever_they_fit_on_a_simulated_clock():
  """The gate lets a variant start when, started now, its build and the timing owed by every
  plan built or building end by the deadline; the planned build phase is no wall: builds that
  run faster than estimated leave time that the variants on standby take, a variant that no
  longer fits is skipped while a shorter one after it still starts, and shapes always start."""
  plans = _gate_plans()
  owe = gpu_plan.PLAN_OVERHEAD_S + 0.1 * (3 + 10 * 3)
  assert owe == pytest.approx(5.8)

  def gate(end_by, fixed_s=20.0, wait_until=0.0):
    return gpu_plan.BuildGate(plans, end_by, fixed_s, wait_until, steps=10, reps=3, warmup=3)

  # As estimated (shapes 50 s, variants 40 s, 10 s): by 160 s two variants fit. The third
  # (40 s, from 102 s: 142 + 20 fixed + 5 plans owed) does not; the short one after it does.
  est = {p["id"]: p["est_compile_s"] for p in plans}
  at, skipped = _replay(gate(160.0), plans, est)
  assert sorted(at) == ["ours0", "ours1", "ours2", "ours3", "ours5"] and skipped == ["ours4"]
  assert at["ours2"][0] == 51.0 and at["ours3"][0] == 52.0  # as the shapes' threads free up
  end = max(e for _, e in at.values()) + 20.0 + owe * len(at)
  assert end <= 160.0
  # The same plans when every build takes half its estimate: the leftover time takes all the
  # variants (the scale of finished builds over their estimates stays 1: never below it).
  at, skipped = _replay(gate(160.0), plans, {k: v / 2 for k, v in est.items()})
  assert sorted(at) == [p["id"] for p in plans] and skipped == []
  # A shape running past its estimate scales every later estimate by its overrun so far: at
  # 93 s, when ours2's thread frees, ours0 has run 93 s of its 50: the 40 s variants no longer
  # fit 200 s (74 s from 93 s), the 10 s one does; finished at 101 s, it sets the scale.
  slow = {**est, "ours0": 100.0}
  g = gate(200.0)
  at, skipped = _replay(g, plans, slow)
  assert at["ours2"] == (52.0, 93.0) and skipped == ["ours3", "ours4"]
  assert at["ours5"][0] == 93.0
  assert g.scale == pytest.approx(101.0 / 50.0)  # lowering included
  # PyTorch's builds ending later hold the timing phase back: with them planned to end at
  # 150 s, nothing but the shapes fits 160 s.
  at, skipped = _replay(gate(160.0, wait_until=150.0), plans, est)
  assert sorted(at) == ["ours0", "ours1"] and skipped == ["ours2", "ours3", "ours4", "ours5"]
  # Past the deadline: shapes start all the same, never a variant.
  at, skipped = _replay(gate(0.0), plans, est)
  assert sorted(at) == ["ours0", "ours1"] and len(skipped) == 4
  # A build that fails is owed nothing: the next variant gets its share.
  g = gate(160.0)
  assert g.try_start(plans[2], 0.0) and g.owed["ours2"] == pytest.approx(owe)
  g.done(plans[2], None)
  assert "ours2" not in g.owed and not g.busy and g.scale == 1.0


def test_build_gate_counts_the_profile_of_a_built_shape_as_owed():
  plans = _gate_plans() + [dict(_plan(6, "profile"), of="ours0")]
  g = gpu_plan.BuildGate(plans, 1e9, 0.0, 0.0, steps=10, reps=3, warmup=3)
  g.owe(plans[0])  # built in the alone phase
  g.try_start(plans[1], 0.0)
  owe = gpu_plan.PLAN_OVERHEAD_S + 0.1 * 33
  assert g.owed == pytest.approx({"ours0": owe + gpu_plan.PROFILE_S["ours"], "ours1": owe})
  assert g.planned_end(plans[2], 10.0) == pytest.approx(50.0 + sum(g.owed.values()) + owe)


def _plan(i, role, variant=None, est=0.05, size="tiny", seq=16, task="pretrain"):
  return dict(id=f"ours{i}", side="ours", impl="bert_jax", role=role, priority=i, task=task,
              size=size, seq=seq, batch=2, variant=variant or {}, est_compile_s=est,
              est_step_s=0.001, est_mem=seq)  # fmt: skip


def _stand_in_prepare(plan, delay_s=0.0):
  """A tiny step in place of BERT's (a matmul and an update), prepared as `step.prepare` does:
  lowered against an abstract state, its init lowered beside it; other variants go to the
  real `prepare_plan` (whose bad fields fail before any compile)."""
  fields, _ = gpu_ours.split_variant(plan["variant"])
  if fields:
    return gpu_ours.prepare_plan(plan, delay_s)
  time.sleep(delay_s)
  n = plan["seq"]
  init = jax.jit(lambda r: {"w": jax.random.normal(r, (n, n))})
  abstract = jax.eval_shape(init, jax.random.key(0))

  def step_fn(state, batch, rng):
    loss = jnp.mean((batch @ state["w"]) ** 2)
    return {"w": state["w"] * 0.99}, {"loss": loss}

  t0 = time.perf_counter()
  lowered = jax.jit(step_fn, donate_argnums=0).lower(abstract, jnp.ones((2, n)), 0)
  lower_s = time.perf_counter() - t0
  cfg = model_config.config_for_size("tiny")
  return step.Prepared(
    lowered, init.lower(jax.random.key(0)), jnp.ones((2, n)), 0, jax.random.key(0), cfg, lower_s
  )


def _records(out: str) -> list[dict]:
  return [json.loads(x[len(protocol.RECORD_MARK) :]) for x in out.splitlines()
          if x.startswith(protocol.RECORD_MARK)]  # fmt: skip


def test_gpu_build_phases_keep_every_shape(capsys, tmp_path):
  """Our worker's alone and build phases: the alone plan first, by itself; then, with time to
  spare, every valid plan; a variant with an unknown model field or XLA option, or a model
  field value that does not exist in this checkout (e.g. a kernel another branch adds), is one
  error line and the rest go on; an XLA option reaches that executable only. Past the
  deadline every shape still builds and is timed (its profile right after it), every variant
  is dropped."""
  plans = [
    dict(_plan(0, "shape", seq=16), alone=True),
    _plan(1, "shape", seq=8),
    _plan(2, "variant", {"xla_gpu_autotune_level": 0}),
    _plan(3, "variant", {"no_such_field": 1}),
    _plan(4, "variant", {"attention_impl": "no_such_impl"}),
    _plan(5, "variant", {"xla_no_such_option": 1}),
    _plan(6, "variant", {"xla_gpu_autotune_level": 0}, seq=4),
  ]
  spec = dict(plans=plans, end_by=time.time() + 1e6, compile_threads=2, prepare_delay_s=0.0,
              build_order=[p["id"] for p in plans[1:]], steps=2, reps=2, warmup=1,
              gate={"fixed_s": 0.0, "wait_until": 0.0})  # fmt: skip
  alone = gpu_ours.build_alone(spec, prepare=_stand_in_prepare)
  (rec,) = _records(capsys.readouterr().out)
  assert [p["id"] for p, _ in alone] == ["ours0"] and rec["alone"] is True
  assert rec["build_s"] == pytest.approx(rec["compile_s"] + rec["init_compile_s"])
  assert rec["compile_s"] >= rec["lower_s"] > 0
  built = gpu_ours.build(spec, prepare=_stand_in_prepare, done=alone)
  by_id = {r["id"]: r for r in _records(capsys.readouterr().out)}
  assert sorted(p["id"] for p, _ in built) == ["ours0", "ours1", "ours2", "ours6"]
  assert "ours0" not in by_id  # built once, in the alone phase
  assert by_id["ours3"]["error"] == (
    "ValueError: --variants key 'no_such_field' is not a BertConfig field"
  )
  assert by_id["ours4"]["error"].startswith("ValueError: attention_impl must be one of")
  assert by_id["ours5"]["kind"] == "error" and "xla_no_such_option" in by_id["ours5"]["error"]
  assert all(by_id[f"ours{i}"]["kind"] == "built" for i in (1, 2, 6))
  # Past the deadline: 0.4 s a preparation against a deadline already gone. Both shapes build
  # (the alone one again, here), every variant is dropped.
  spec.update(end_by=time.time() - 1, prepare_delay_s=0.4, profile_dir=str(tmp_path),
              plans=plans + [dict(_plan(7, "profile"), id="profile:ours1", of="ours1")],
              build_order=[p["id"] for p in plans])  # fmt: skip
  built = gpu_ours.build(spec, prepare=_stand_in_prepare)
  assert sorted(p["id"] for p, _ in built) == ["ours0", "ours1"]
  first = _records(capsys.readouterr().out)
  assert {r["id"]: r["why"] for r in first if r["kind"] == "skipped"} == {
    f"ours{i}": "build deadline" for i in (2, 3, 4, 5, 6)
  }
  assert all(st.state is None for _, st in built)  # no state before its timing
  spec["end_by"] = time.time() + 1e6
  gpu_ours.time_built(spec, built, gpu_ours._matmuls(8, chain=2))
  recs = _records(capsys.readouterr().out)
  assert [r["kind"] for r in recs] == ["peak", "step", "profile", "step"]
  assert [r["id"] for r in recs[1:]] == ["ours1", "profile:ours1", "ours0"]  # smaller first
  for r in (recs[1], recs[3]):
    assert len(r["step_s_all"]) == 2 and r["step_s"] == min(r["step_s_all"])
    assert len(r["losses"]) == 2 and r["losses"][1] < r["losses"][0]  # w shrinks each step
  prof = recs[2]
  assert prof["of"] == "ours1" and prof["device_ms"] > 0
  assert prof["kernel_device_ms"] == pytest.approx(prof["device_ms"])  # the same events
  assert prof["kernel_families_ms"]["gemm"] > 0  # the step's dot
  # The traced step's Chrome trace, copied flat under profile_dir (no deeper than the device
  # tool brings back): its events include the step's top op.
  assert prof["trace_file"] == str(tmp_path / "ours-tiny8.trace.json.gz")
  trace = kernel_families.read_trace(prof["trace_file"])
  assert prof["kernel_top"][0]["kernel"] in {e.get("name") for e in trace["traceEvents"]}


def test_gpu_build_leaves_behind_a_compile_that_would_cost_the_timings(capsys):
  """A compile still running when timing what is built must start (the parent stops the
  workers at `hard_until`) is left behind with a `skipped` line, the phase ends with what is
  built, and no `built` line follows when that compile ends later."""
  release = threading.Event()

  class Slow:  # a lowered step whose compile waits until the test lets it go
    def __init__(self, lowered):
      self.lowered = lowered

    def compile(self, **kw):
      release.wait(60)
      return self.lowered.compile(**kw)

  def prepare(plan, delay_s=0.0):
    p = _stand_in_prepare(plan)
    return dataclasses.replace(p, lowered=Slow(p.lowered)) if plan["id"] == "ours1" else p

  plans = [_plan(0, "shape", seq=16), _plan(1, "shape", seq=8)]
  owed = gpu_plan.PLAN_OVERHEAD_S + 0.001 * (1 + 2 * 2)  # ours0's timing, owed besides ours1
  spec = dict(plans=plans, end_by=time.time() + 1e6, compile_threads=2, steps=2, reps=2,
              warmup=1, gate={"fixed_s": 0.0, "wait_until": 0.0},
              hard_until=time.time() + owed + 6.0)  # fmt: skip
  built = gpu_ours.build(spec, prepare=prepare)
  assert [p["id"] for p, _ in built] == ["ours0"]
  recs = _records(capsys.readouterr().out)
  assert [(r["id"], r["kind"]) for r in recs] == [("ours0", "built"), ("ours1", "skipped")]
  assert recs[1]["why"] == "still compiling when the timing of what was built had to start"
  release.set()
  for _ in range(100):  # the compile left behind ends in its thread
    if not any(t.name.startswith("ThreadPoolExecutor") and t.is_alive()
               for t in threading.enumerate()):  # fmt: skip
      break
    time.sleep(0.1)
  assert _records(capsys.readouterr().out) == []


def test_gpu_cli_dry_run_prints_the_plan_and_empty_variants_mean_none(tmp_path):
  def plan(*extra):
    out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.jsonl"
    argv = [sys.executable, "-m", "bert_jax.benchmark", "--gpu", "--dry_run", f"--json_out={out}"]
    proc = subprocess.run(argv + list(extra), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    return proc.stdout, recs

  stdout, recs = plan()
  (p,) = [r for r in recs if r["kind"] == "gpu_plan"]
  assert p["deadline_s"] == _device_run_limits()[0]  # the CLI's default is the script's
  assert any(x["role"] == "variant" for x in p["plans"])
  # Our variants that do not fit wait on standby (built only if time is left), not skipped.
  assert p["standby"] and not {x["id"] for x in p["plans"]} & set(p["standby"])
  assert all(i.startswith("ours") for i in p["standby"])
  assert not {r["id"] for r in recs if r["kind"] == "skipped"} & set(p["standby"])
  assert "| 0 | ours bert_jax pretrain base 128 x 256 | shape |" in stdout
  assert "| 1 | ours bert_jax pretrain large 128 x 256 (alone) | shape |" in stdout
  assert "planned end" in stdout
  stdout, recs = plan("--variants=", "--shapes=base128,large512", "--torch_modes=")
  (p,) = [r for r in recs if r["kind"] == "gpu_plan"]
  assert [(x["role"], x["size"], x["seq"]) for x in p["plans"]] == [
    ("shape", "base", 128), ("shape", "large", 512), ("profile", "base", 128),
    ("profile", "large", 512),
  ]  # fmt: skip
  assert p["standby"] == [] and not [r for r in recs if r["kind"] == "skipped"]
  _, recs = plan("--compile_alone=", "--profile=large128", "--variants=")
  (p,) = [r for r in recs if r["kind"] == "gpu_plan"]
  assert not any(x.get("alone") for x in p["plans"])
  assert [(x["side"], x["size"], x["seq"]) for x in p["plans"] if x["role"] == "profile"] == [
    ("ours", "large", 128), ("torch", "large", 128)
  ]  # fmt: skip


# ----------------------------------------------------------------------------- profile


def _flax_step():
  """A tiny training step with each family's ops: a dense layer, an attention function
  (einsum, softmax), LayerNorm, dropout bits, optax's AdamW."""
  import flax.linen as nn
  import optax

  def self_attention(x_BLD):
    s_BLL = jnp.einsum("bld,bmd->blm", x_BLD, x_BLD)
    return jnp.einsum("blm,bmd->bld", jax.nn.softmax(s_BLL), x_BLD)

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x_BLD, rng):
      h = nn.Dense(64)(x_BLD)
      h = self_attention(h)
      h = nn.LayerNorm(name="LayerNorm")(h)
      keep = jax.random.bernoulli(rng, 0.9, h.shape)
      return jnp.where(keep, h / 0.9, 0.0)

  net = Net()
  x = jnp.ones((4, 32, 64))
  params = net.init(jax.random.key(0), x, jax.random.key(1))
  tx = optax.adamw(1e-3)

  def apply_update(grads, opt_state, params):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def train_step(state, rng):
    params, opt_state = state
    loss, grads = jax.value_and_grad(lambda p: jnp.mean(net.apply(p, x, rng) ** 2))(params)
    return apply_update(grads, opt_state, params), loss

  compiled = jax.jit(train_step).lower((params, tx.init(params)), jax.random.key(2)).compile()
  return compiled, (params, tx.init(params))


def test_profile_of_a_traced_cpu_step_by_kernel_family(tmp_path):
  compiled, state = _flax_step()
  holder = [state]

  def one():
    holder[0], loss = compiled(holder[0], jax.random.key(3))
    jax.block_until_ready(loss)

  one()
  rec = benchmark_profile.profile_step(one, compiled.as_text(), steps=2, log_dir=str(tmp_path))
  fams = rec["families_ms"]
  assert set(fams) == set(benchmark_profile.FAMILIES)
  assert rec["device_ms"] == pytest.approx(sum(fams.values()))
  for family in ("matmuls", "attention", "rng", "optimizer"):
    assert fams[family] > 0, (family, fams)
  assert rec["attributed"] > 0.99  # XLA:CPU names the HLO op of every thunk it runs
  assert rec["steps"] == 2 and rec["trace_file"].startswith(str(tmp_path))
  assert rec["top"] and rec["top"][0]["ms"] == max(k["ms"] for k in rec["top"])
  hlo = benchmark_profile.HloIndex(compiled.as_text())
  for k in rec["top"]:  # each kernel's family is its HLO instruction's
    assert k["family"] == benchmark_profile.classify(hlo.evidence(k["hlo_op"]))
  table = benchmark_profile.format_profile({**rec, "side": "ours", "task": "pretrain"})
  assert "| matmuls (other dots) |" in table and "| total |" in table


def test_profile_classifies_gpu_kernels_by_hlo_op_or_by_name():
  """A GPU-shaped trace (a device plane's stream, kernels named by cuBLAS, cuDNN and XLA):
  kernels tied to HLO ops by their annotation or name follow the instruction; the others
  go by `GPU_KERNEL_PATTERNS`."""
  from types import SimpleNamespace as NS

  hlo = (
    "HloModule jit_train_step, is_scheduled=true\n\n"
    "%fused_computation.3 (p: f32[8]) -> f32[8] {\n"
    "  %p = f32[8]{0} parameter(0)\n"
    "  ROOT %m = f32[8]{0} multiply(f32[8]{0} %p, f32[8]{0} %p), metadata={op_name="
    '"jit(train_step)/jvp(Bert)/encoder/attention_LayerNorm/mul"}\n'
    "}\n\n"
    "ENTRY %main (a: f32[8]) -> (f32[8], f32[8,8]) {\n"
    "  %a = f32[8]{0} parameter(0)\n"
    "  %loop_multiply_fusion.3 = f32[8]{0} fusion(f32[8]{0} %a), kind=kLoop, "
    "calls=%fused_computation.3\n"
    "  %custom-call.7 = (f32[8,8]{1,0}, s8[0]{0}) custom-call(f32[8]{0} %a), custom_call_target="
    '"__cublas$gemm", metadata={op_name="jit(train_step)/jvp(Bert)/encoder/intermediate/dot"}\n'
    "  ROOT %t = (f32[8], f32[8,8]) tuple(%loop_multiply_fusion.3, %custom-call.7)\n"
    "}\n"
  )
  index = benchmark_profile.HloIndex(hlo)
  assert index.module == "jit_train_step"
  assert index.instrs["custom-call.7"].opcode == "custom-call"
  annotation = "XlaModule:#hlo_module=jit_train_step,program_id=4#::Thunk:#hlo_op=custom-call.7#"

  def ev(name, start, dur, **stats):
    return NS(name=name, start_ns=start, duration_ns=dur, end_ns=start + dur, stats=stats.items())

  stream = NS(name="Stream #13(Compute)", events=[
    ev("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 0, 500, ann=annotation),
    ev("loop_multiply_fusion_3", 600, 100),  # XLA names the kernel after its fusion
    ev("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0", 800, 300),
    ev("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", 1200, 200),
    ev("input_reduce_fusion_12", 1500, 50),
    ev("MemcpyD2D", 1600, 10),
    ev("other_module_fusion", 1700, 999, hlo_module="jit_other"),
  ])  # fmt: skip
  derived = NS(name="XLA Ops", events=[ev("x", 0, 9)])  # XProf's copy of the kernels
  host_line = NS(name="python", events=[ev("py", 0, 5000)])
  planes = [NS(name="/device:GPU:0", lines=[stream, derived]),
            NS(name="/host:CPU", lines=[host_line])]  # fmt: skip
  events = benchmark_profile.trace_events(planes)
  assert [e.name for e in events][:2] == [stream.events[0].name, "loop_multiply_fusion_3"]
  out = benchmark_profile.summarize(events, index, steps=1)
  fams = out["families_ms"]
  assert fams["matmuls"] == pytest.approx((500 + 200) / 1e6)  # by hlo_op, and by name
  assert fams["layernorm"] == pytest.approx(100 / 1e6)  # by the fusion's ops' op_name
  assert fams["attention"] == pytest.approx(300 / 1e6)
  assert fams["reductions"] == pytest.approx(50 / 1e6)
  assert fams["copies"] == pytest.approx(10 / 1e6)
  assert out["device_ms"] == pytest.approx(1160 / 1e6)  # jit_other's kernel left out
  assert out["attributed"] == pytest.approx(600 / 1160)
  assert out["span_ms"] == pytest.approx(1610 / 1e6)
  for name, family in (
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "attention"),
    ("cutlass3x_sm90_tensorop_gemm_bf16_128x256x64_warpspecialized", "matmuls"),
    ("void at::native::(anonymous)::fused_dropout_kernel_philox", "rng"),
    ("triton_per_fused_native_layer_norm_3", "layernorm"),
    ("loop_add_fusion_7", "other"),
  ):
    assert benchmark_profile.classify_name(name) == family, name


def _jsonl(path) -> list[dict]:
  return [json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if x.strip()]


def test_kernel_families_of_the_h200_trace_of_our_base_step():
  """The 2026-11-28 H200 trace of our default Base 128 x 256 step (then threefry dropout and
  the explicit attention), by kernel name: every kernel on the device's stream once (the host
  threads left out), the same device time, span and kernel count as that run's `profile`
  record, and the families NOTES-gpu.md read off the same trace by hand (GEMMs 29.0 ms,
  reduce fusions 10.6, transpose 8.9, compares 6.2, elementwise loops 5.2, other 4.9)."""
  trace = kernel_families.read_trace(str(RUNS / "profile-base128-default.trace.json.gz"))
  kernels = kernel_families.device_kernels(trace)
  assert len(kernels) == 2252
  out = kernel_families.summarize(kernels, steps=1)
  (rec,) = [r for r in _jsonl(RUNS / "call1-default-deadline475.jsonl") if r["kind"] == "profile"]
  assert out["device_ms"] == pytest.approx(rec["device_ms"])
  assert out["span_ms"] == pytest.approx(rec["span_ms"])
  assert out["kernels"] == rec["ops"] == 314
  fams = {k: round(v, 2) for k, v in out["families_ms"].items()}
  assert fams == {
    "attention": 0.0,  # no fused attention kernel: the explicit attention's dots are GEMMs
    "gemm": 29.16,  # cuBLAS's nvjet and CUTLASS kernels, XLA's Triton GEMMs, split-K reductions
    "optimizer": 0.0,  # XLA's AdamW is loop fusions (elementwise) by name
    "rng_compare": 6.28,  # the compare fusions (threefry bits inside them) and a few xor/adds
    "transpose": 8.91,
    "reduce": 10.4,
    "elementwise": 5.55,
    "copy": 0.12,  # the memset, a concatenation, a memcpy
    "other": 5.19,  # XLA's generic fusion_N, scatters, sorts
  }
  top = out["top"][0]
  assert (top["kernel"], top["family"], top["calls"]) == (
    "input_compare_transpose_fusion_19", "rng_compare", 21
  )  # fmt: skip
  assert top["ms"] == pytest.approx(3.98, abs=0.005)


def test_kernel_families_name_both_sides_kernels_alike():
  for name, family in (
    # ours: XLA's fusions, cuBLAS, Pallas' flash kernels
    ("input_add_reduce_fusion_11", "reduce"),
    ("input_compare_transpose_fusion_19", "rng_compare"),
    ("loop_add_xor_fusion_3", "rng_compare"),
    ("loop_transpose_fusion_34", "transpose"),
    ("loop_convert_multiply_fusion_11", "elementwise"),
    ("gemm_fusion_dot_235", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x128_32x3_nn_align1>(...)", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
    ("flash_attention_dkv", "attention"),
    ("wrapped_concatenate", "copy"),
    ("Memset 0", "copy"),
    ("input_scatter_fusion_2", "other"),
    ("fusion_2283", "other"),
    # torch.compile: Inductor's Triton kernels, ATen's, cuBLAS's, SDPA's
    ("triton_tem_fused_addmm_gelu_3", "gemm"),
    ("triton_per_fused_native_layer_norm_7", "reduce"),
    ("triton_red_fused_sum_2", "reduce"),
    ("triton_poi_fused_native_dropout_4", "rng_compare"),
    ("triton_poi_fused_clone_1", "transpose"),
    ("triton_poi_fused__to_copy_add_0", "elementwise"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    ("pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Traits>", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<4>, "
     "FusedAdamMathFunctor<float, 4>, float*>", "optimizer"),
    ("void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reduce"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("operand_fusion", "other"),  # `rand` inside a word is no RNG
  ):  # fmt: skip
    assert kernel_families.classify(name) == family, name
  # XLA's generic fusion names go by the opcodes of their HLO instruction, other names never.
  assert kernel_families.classify("fusion_2283", "compare multiply select") == "rng_compare"
  assert kernel_families.classify("ynn_fusion.101", "dot") == "gemm"
  assert kernel_families.classify("input_scatter_fusion", "add") == "other"


def test_kernel_families_read_torch_profiler_traces():
  """torch.profiler's Chrome trace: the device's kernels, copies and memsets (not the CUDA
  runtime's or the CPU's ops); without any (a CPU run) the CPU ops, each less the ops inside."""

  def x(name, cat, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur}

  gpu = {"traceEvents": [
    x("aten::addmm", "cpu_op", 0, 50), x("cudaLaunchKernel", "cuda_runtime", 1, 5),
    x("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", 10, 30, tid=7),
    x("triton_poi_fused_native_dropout_0", "kernel", 45, 5, tid=7),
    x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 60, 2, tid=7),
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}},
  ]}  # fmt: skip
  out = kernel_families.summarize(kernel_families.device_kernels(gpu), steps=2)
  assert out["device_ms"] == pytest.approx(37e-3 / 2) and out["span_ms"] == pytest.approx(26e-3)
  assert {k: v for k, v in out["families_ms"].items() if v} == pytest.approx(
    {"gemm": 15e-3, "rng_compare": 2.5e-3, "copy": 1e-3}
  )
  cpu = {"traceEvents": [
    x("aten::linear", "cpu_op", 0, 100), x("aten::addmm", "cpu_op", 10, 60),
    x("aten::copy_", "cpu_op", 20, 10), x("aten::gelu", "cpu_op", 200, 40, tid=2),
  ]}  # fmt: skip
  got = {name: dur for name, _, dur, _ in kernel_families.device_kernels(cpu)}
  assert got == {"aten::linear": 40, "aten::addmm": 50, "aten::copy_": 10, "aten::gelu": 40}


def test_must_show_and_summaries_of_the_h200_run():
  """Issue 44's must-show lines from call 1 of 2026-11-28 (the old default): every ratio below
  its bar, MFU and memory short, the matmul as one call only, no alone build."""
  records = _jsonl(RUNS / "call1-default-deadline475.jsonl")
  records = [gpu.enrich(r, {}) if r["kind"] == "step" else r for r in records]
  summary = gpu.summary_records(records)
  (gemm,) = summary
  assert gemm["kind"] == "gemm" and gemm["call_ratio"] == pytest.approx(681.385 / 792.787, 1e-4)
  assert "chain_ratio" not in gemm  # that run timed one call only
  lines = gpu.must_show(records + summary)
  assert lines[1:] == [
    "1. base 128 x 256: ours 3,833 seq/s, torch.compile 4,108, eager 2,783: 0.93x "
    "(at least 1.2x: NOT met)",
    "1. large 128 x 256: ours 1,343 seq/s, torch.compile 1,582, eager 1,226: 0.85x "
    "(at least 1.1x: NOT met)",
    "1. large 512 x 64: ours 242 seq/s, torch.compile 342, eager 286: 0.71x "
    "(at least 1.1x: NOT met)",
    "2. MFU at large 128 x 256: 32.7% (torch.compile 38.5%) (at least 42%: NOT met)",
    "2. step memory at large 512 x 64: ours 81.1 GiB, torch.compile 34.6 GiB "
    "(at most torch.compile's: NOT met)",
    "3. bf16 matmul: one call only (ours / PyTorch 0.859); the chain of products not taken",
    "5. cold build of large 128 x 256, each alone: not taken",
  ]


def test_gemm_gap_and_compile_alone_summaries():
  """The parent's `gemm` record: the chains' ratio, and per profiled step of ours the GEMM
  kernels' ms times the gap; `compile_alone`: our lowering + compile + init against
  torch.compile's first step less a steady one."""
  shape = dict(task="pretrain", size="base", seq=128, batch=256, variant={})
  records = [
    {"kind": "peak", "side": "ours", "tflops": 660.0, "tflops_chain": 760.0, "matmul_n": 8192},
    {"kind": "peak", "side": "torch", "tflops": 793.0, "tflops_chain": 800.0},
    {"kind": "profile", "side": "ours", "of": "ours0", **shape, "kernel_device_ms": 56.0,
     "kernel_families_ms": {"gemm": 30.0}},
    {"kind": "built", "side": "ours", "id": "ours1", "alone": True, **shape, "size": "large",
     "build_s": 77.0, "lower_s": 7.8, "compile_s": 71.5, "init_compile_s": 5.5,
     "compile_cache_hit": False},
    {"kind": "built", "side": "torch", "id": "torch4", "impl": "torch_compile", "alone": True,
     **shape, "size": "large", "first_step_s": 60.2},
    {"kind": "step", "side": "torch", "id": "torch4", "impl": "torch_compile", **shape,
     "size": "large", "step_s": 0.2, "variant": {}},
  ]  # fmt: skip
  gemm, alone = gpu.summary_records(records)
  assert gemm["chain_ratio"] == pytest.approx(0.95) and gemm["within_5pct"]
  (st,) = gemm["steps"]
  assert (st["of"], st["gemm_ms"], st["gap_ms"]) == ("ours0", 30.0, pytest.approx(1.5))
  assert alone["ours_build_s"] == 77.0 and alone["ours_compile_s"] == pytest.approx(63.7)
  assert alone["torch_compile_s"] == pytest.approx(60.0)
  assert alone["ratio"] == pytest.approx(77.0 / 60.0)
  lines = gpu.must_show(records + [gemm, alone])
  assert lines[-2].startswith("3. bf16 matmul, chain of products: ours / PyTorch 0.950 (within")
  assert "base 128: 1.5 of 56.0 ms" in lines[-2]
  assert lines[-1] == (
    "5. cold build of large 128 x 256, each alone: ours 77 s, torch_compile 60 s "
    "(no slower: NOT met)"
  )
  assert "ours 77.0 s (lowering 7.8, compile 63.7, state init 5.5)" in gpu.format_compile_alone(
    alone
  )


def test_cpu_reference_compares_the_plan_with_its_dropout_bits(tmp_path):
  """tools/gpu/cpu_reference.py --compare takes the Base 128 x 256 plan that ran threefry
  dropout with the explicit attention: the default in the 2026-11-28 run (3.19e-4, as its
  losses.txt), the old default's variant where the default resolves otherwise."""
  script = REPO / "tools" / "gpu" / "cpu_reference.py"

  def compare(path):
    argv = [sys.executable, str(script), f"--compare={path}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)

  proc = compare(RUNS / "call1-default-deadline475.jsonl")
  assert proc.returncode == 0, proc.stderr[-1000:]
  assert proc.stdout.splitlines()[0] == "GPU plan: ours0 (default)"
  assert "largest relative difference 3.19e-04 (within 0.01)" in proc.stdout
  base = dict(side="ours", task="pretrain", size="base", seq=128, batch=256)
  old = {"dropout_rng": "threefry", "attention_impl": "explicit"}
  recs = [
    {**base, "kind": "built", "id": "ours0", "variant": {}, "kernels": "xla",
     "dropout_rng": "hash", "attention": "flash"},
    {**base, "kind": "built", "id": "ours3", "variant": old, "kernels": "xla",
     "dropout_rng": "threefry", "attention": "explicit"},
    {**base, "kind": "step", "id": "ours0", "variant": {}, "losses": [1.0, 1.0, 1.0]},
    {**base, "kind": "step", "id": "ours3", "variant": old, "losses": [11.13, 11.134, 11.1266]},
  ]  # fmt: skip
  path = tmp_path / "gpu.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in recs))
  proc = compare(path)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-1000:]
  assert "GPU plan: ours3 (dropout_rng=threefry,attention_impl=explicit)" in proc.stdout
  path.write_text("".join(json.dumps(r) + "\n" for r in recs if r["id"] == "ours0"))
  proc = compare(path)
  assert proc.returncode == 1 and "with the reference's dropout bits" in proc.stderr


# ----------------------------------------------------------------------------- --gpu smoke


def _smoke_checks(records, torch_side: bool):
  steps = [r for r in records if r["kind"] == "step"]
  ours = [r for r in steps if r["side"] == "ours"]
  assert {(r["task"], r["size"], r["seq"]) for r in ours} == {
    ("pretrain", "tiny", 128), ("pretrain", "tiny", 64), ("finetune", "tiny", 128)
  }  # fmt: skip
  (peak,) = [r for r in records if r["kind"] == "peak" and r["side"] == "ours"]
  vocab = model_config.config_for_size("tiny").vocab_size
  for r in steps:
    assert r["step_s"] == min(r["step_s_all"]) and len(r["step_s_all"]) == 2
    assert r["tokens_per_s"] == pytest.approx(r["batch"] * r["seq"] / r["step_s"])
    assert r["flops_per_token"] == sizes.standard_flops_per_token(r["size"], r["seq"], r["task"])
    fresh = math.log(2) + (math.log(vocab) if r["task"] == "pretrain" else 0)
    assert all(abs(x - fresh) < 0.6 for x in r["losses"]), r["losses"]
    assert "mfu_datasheet" not in r  # a CPU has no datasheet entry
  for r in ours:
    assert r["mfu_measured_peak"] == pytest.approx(r["tflops"] / peak["tflops_chain"])
    assert r["mfu_measured_peak_f32out"] == pytest.approx(r["tflops"] / peak["tflops_f32out"])
  assert {r["side"] for r in steps} == ({"ours", "torch"} if torch_side else {"ours"})
  table = gpu.format_gpu_table(records)
  assert "| pretrain | tiny | 128 x 8 | bert_jax | - |" in table
  assert "| finetune | tiny | 128 x 8 | bert_jax | - |" in table
  return table


@pytest.mark.slow
def test_gpu_smoke_run_on_cpu(tmp_path):
  """`--gpu_smoke`'s plumbing end to end at BERT-tiny: each side's alone build of tiny 64 x 4
  (ours first) before anything else builds, then both workers build in parallel (ours with
  each preparation slowed), PyTorch's times first, then ours, each profiling its tiny 128 x 8
  step; rates, FLOPs, MFU, the table, the summaries (PyTorch eager only: torch.compile on
  this CPU takes minutes; no PyTorch side without torch)."""
  torch_side = _peer_python() is not None
  out = tmp_path / "gpu.jsonl"
  records = gpu.run_gpu(
    smoke=True, deadline_s=900, variants=[{"no_such_field": 1}], torch_modes=["eager"],
    steps=1, reps=2, warmup=1, compile_threads=2, peer_python=_peer_python() or sys.executable,
    json_out=str(out), prepare_delay_s=2.0, profile_dir=str(tmp_path / "profile"),
  )  # fmt: skip
  assert [json.loads(x)["kind"] for x in out.read_text().splitlines()] == [
    r["kind"] for r in records
  ]
  table = _smoke_checks(records, torch_side)
  assert "error: ours bert_jax pretrain tiny 128 8 no_such_field=1 - ValueError" in table
  if torch_side:
    assert "| pretrain | tiny | 128 x 8 | torch | - |" in table
    assert all(r["attn_implementation"] == "sdpa" for r in records if r.get("side") == "torch"
               and r["kind"] == "step")  # fmt: skip
  # The alone builds first, ours then PyTorch's, each done before the next build ended.
  built = [r for r in records if r["kind"] == "built"]
  alone = [r for r in built if r.get("alone")]
  assert [(r["side"], r["size"], r["seq"]) for r in alone] == [("ours", "tiny", 64)] + (
    [("torch", "tiny", 64)] if torch_side else []
  )
  assert built[: len(alone)] == alone
  # Every build ended before any step was timed, PyTorch's steps before ours.
  t_built = max(r["t_s"] for r in built)
  t_steps = [(r["t_s"], r["side"]) for r in records if r["kind"] in ("peak", "step")]
  assert min(t for t, _ in t_steps) >= t_built
  assert [s for _, s in t_steps] == sorted((s for _, s in t_steps), key=lambda s: s == "ours")
  # The profiles of the tiny 128 x 8 steps, from real traces of them, kept as Chrome traces.
  profs = {r["side"]: r for r in records if r["kind"] == "profile"}
  assert set(profs) == ({"ours", "torch"} if torch_side else {"ours"})
  prof = profs["ours"]
  assert (prof["size"], prof["seq"], prof["batch"]) == ("tiny", 128, 8)
  assert prof["families_ms"]["matmuls"] > 0 and prof["families_ms"]["rng"] > 0
  assert prof["device_ms"] == pytest.approx(sum(prof["families_ms"].values()))
  assert prof["kernel_device_ms"] == pytest.approx(prof["device_ms"])
  assert "| matmuls (other dots) |" in table
  assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == sorted(
    f"{side}-tiny128.trace.json.gz" for side in profs
  )
  (alone_rec,) = [r for r in records if r["kind"] == "compile_alone"]
  assert alone_rec["ours_build_s"] == alone[0]["build_s"]
  if torch_side:
    assert "| family | ours ms | torch ms | ours - torch |" in table
    (gemm,) = [r for r in records if r["kind"] == "gemm"]
    assert gemm["chain_ratio"] > 0 and gemm["steps"][0]["of"] == prof["of"]
  assert "must-show (issue 44)" in table


@pytest.mark.slow
def test_device_run_script_dry_runs_on_cpu(tmp_path):
  """tools/gpu/device_run.sh as the device tool runs it, on this CPU at toy size
  (`--gpu_smoke`, one tiny shape, a short deadline), so the GPU call cannot die of a typo: at
  most 8 files under $OUT, none deeper than $OUT/a/b/file and each named as the tool brings
  them back; the JSON lines hold every phase and the log the tables; the loss comparison says
  there is no Base step to compare; the exit status is the benchmark's."""
  out = tmp_path / "out"
  env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "WHEELS": ""}
  peer = _peer_python()
  extra = ["--gpu_smoke", "--shapes=tiny64", "--variants=", "--deadline=400"]
  extra += [f"--peer_python={peer}", "--torch_modes=eager"] if peer else ["--torch_modes="]
  proc = subprocess.run(["bash", str(DEVICE_RUN), *extra], env=env, capture_output=True,
                        text=True, timeout=900)  # fmt: skip
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
  sides = ["ours", "torch"] if peer else ["ours"]
  assert files == sorted(
    ["env.txt", "gpu.jsonl", "gpu.log", "losses.txt"]
    + [f"profile/{side}-tiny64.trace.json.gz" for side in sides]
  )
  assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)?", f)
                                 for f in files)  # fmt: skip
  records = _jsonl(out / "gpu.jsonl")
  kinds = {r["kind"] for r in records}
  assert {"gpu_plan", "env", "built", "peak", "step", "profile", "compile_alone"} <= kinds
  assert records[-1]["kind"] == "gpu_done" and records[-1]["deadline_s"] == 400
  assert "gemm" in kinds if peer else "gemm" not in kinds
  assert [r["side"] for r in records if r["kind"] == "built" and r.get("alone")] == sides
  log = (out / "gpu.log").read_text()
  assert "| task | model | seq x batch |" in log and "must-show (issue 44)" in log
  assert "no timed step of our Base 128 x 256" in (out / "losses.txt").read_text()
  for side in sides:
    trace = kernel_families.read_trace(str(out / "profile" / f"{side}-tiny64.trace.json.gz"))
    assert trace["traceEvents"]


def test_gpu_cli_past_its_deadline_skips_everything_and_says_so(tmp_path):
  out = tmp_path / "gpu.jsonl"
  argv = [sys.executable, "-m", "bert_jax.benchmark", "--gpu_smoke", "--deadline=0"]
  argv += ["--torch_modes=", f"--json_out={out}", "--compilation_cache_dir=none"]
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  records = [json.loads(x) for x in out.read_text().splitlines()]
  plans = gpu_plan.make_plans(smoke=True, torch_modes=[])
  skipped = [r for r in records if r["kind"] == "skipped"]
  assert sorted(r["id"] for r in skipped) == sorted(p["id"] for p in plans)
  assert all(r["why"] == "build deadline" and r["planned"] for r in skipped)
  assert not [r for r in records if r["kind"] in ("step", "error", "built")]
  assert "skipped: ours bert_jax pretrain tiny 128 8 - build deadline" in proc.stdout
  assert "| task | model | seq x batch |" in proc.stdout
