"""bert_jax.benchmark.gpu_ours, our worker of the GPU comparison, on the CPU: the matmul peaks, the
build phases, what a late compile would cost."""

import dataclasses
import json
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.benchmark import (
  gpu_ours,
  gpu_plan,
  kernel_families,
  protocol,
)
from lab._benchmark import _plan, _records, _stand_in_prepare


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
  # The init compiles beside the step: the build's wall time covers each of them, not their sum.
  assert rec["build_s"] >= max(rec["compile_s"], rec["lower_s"] + rec["init_compile_s"])
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


def test_jax_options_of_a_variant_hold_while_its_step_lowers_and_nowhere_else():
  """`jax_*` keys of a variant are JAX options of its lowering (not BertConfig fields, not XLA
  options), set in this thread only while `prepare_plan` lowers; an unknown one is one line."""
  import jax

  variant = {"jax_threefry_gpu_kernel_lowering": True, "remat_policy": "gelu"}
  assert gpu_ours.split_variant(variant) == ({"remat_policy": "gelu"}, {})
  assert jax.config.jax_threefry_gpu_kernel_lowering is False
  with gpu_ours.jax_options(variant):
    assert jax.config.jax_threefry_gpu_kernel_lowering is True
  assert jax.config.jax_threefry_gpu_kernel_lowering is False
  with pytest.raises(ValueError, match="'jax_no_such_option' is not a JAX option of the lowering"):
    with gpu_ours.jax_options({"jax_no_such_option": 1}):
      pass
  prepared = gpu_ours.prepare_plan(_plan(0, "variant", {"jax_threefry_gpu_kernel_lowering": True}))
  assert prepared.lowered is not None and prepared.init_lowered is not None
