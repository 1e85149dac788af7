"""bert_jax.benchmark's GPU comparison (`--gpu`), run here on the CPU: the plan and its
admission against the deadline, our worker's build and timing phases, the matmul peaks, the
profile parser on a traced CPU step and on GPU-shaped events, the smoke run of both workers."""

import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax.benchmark import gpu, gpu_ours, gpu_plan, peers, protocol, sizes, step, suite
from bert_jax.benchmark import profile as benchmark_profile

PACKAGE = pathlib.Path(step.__file__).parent


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


def test_our_matmul_peaks_with_a_bf16_and_a_float32_result(capsys):
  gpu_ours._peaks(gpu_ours._matmuls(128))
  (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith(protocol.RECORD_MARK)]
  rec = json.loads(line[len(protocol.RECORD_MARK) :])
  assert rec["kind"] == "peak" and rec["matmul_n"] == 128
  assert rec["tflops"] > 0 and rec["tflops_f32out"] > 0
  f = gpu_ours._matmuls(8)
  x = f["bf16"][1]
  assert f["bf16"][0](x).dtype == jnp.bfloat16 and f["f32out"][0](x).dtype == jnp.float32


def test_gpu_plans_shapes_variants_and_peers():
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
  # Then the profile of our first shape, then the variants in the order given.
  (prof,) = [p for p in plans if p["role"] == "profile"]
  assert prof["of"] == ours[0]["id"] and prof["priority"] == len(ours) + len(torch_plans)
  variants = [p for p in plans if p["role"] == "variant"]
  assert [p["priority"] for p in plans] == list(range(len(plans)))
  assert min(p["priority"] for p in variants) > prof["priority"]
  assert [(p["side"], p["size"], p["variant"]) for p in variants[:2]] == [
    ("ours", "base", {"dropout_rng": "hash"}),
    ("ours", "base", {"dropout_rng": "rbg"}),
  ]
  cudnn, peer = [p for p in variants if p["variant"].get("attention_dropout_prob") == 0]
  assert cudnn["variant"]["attention_impl"] == "cudnn" and peer["side"] == "torch"
  # The PyTorch peer at the same setting: attention dropout 0, hidden 0.1, torch.compile; it
  # is admitted only with the variant of ours listed before it.
  assert (peer["impl"], peer["attention_dropout"], peer["dropout"]) == ("torch_compile", 0.0, 0.1)
  assert peer["with"] == cudnn["id"]
  assert variants[-1]["size"] == "large" and variants[-1]["variant"] == {"scan_layers": True}
  assert {"xla_gpu_autotune_level": 0} in [p["variant"] for p in variants]
  # Scanned layers compile one body: a smaller estimate than the unrolled model's.
  assert variants[-1]["est_compile_s"] < ours[1]["est_compile_s"]
  assert len({p["id"] for p in plans}) == len(plans)
  # --variants= means none; --shapes picks the shapes; --profile= none; ours alone.
  plans = gpu_plan.make_plans(variants=[], torch_modes=[], shapes=["large512"], profile=[])
  assert [(p["side"], p["role"], p["size"], p["seq"]) for p in plans] == [
    ("ours", "shape", "large", 512)
  ]
  assert suite.parse_variants("") == []
  plans = gpu_plan.make_plans(variants=[{"task": "finetune", "seq": "64"}], torch_modes=[])
  assert (plans[-1]["task"], plans[-1]["seq"], plans[-1]["variant"]) == ("finetune", 64, {})
  with pytest.raises(ValueError, match="unknown size 'huge'"):
    gpu_plan.make_plans(variants=[{"size": "huge"}])
  with pytest.raises(ValueError, match="unknown mode 'jit'"):
    gpu_plan.make_plans(torch_modes=["jit"])
  with pytest.raises(ValueError, match="unknown shape 'base999'"):
    gpu_plan.make_plans(shapes=["base999"])
  with pytest.raises(ValueError, match="side=torch: scan_layers not one of"):
    gpu_plan.make_plans(variants=[{"side": "torch", "scan_layers": True}])


def _device_run_limits() -> tuple[float, float]:
  """(the benchmark's --deadline, its hard timeout) in tools/gpu/device_run.sh."""
  text = (PACKAGE.parents[1] / "tools" / "gpu" / "device_run.sh").read_text()
  (deadline,) = re.findall(r"--deadline=(\d+)", text)
  (timeout,) = re.findall(r"timeout (\d+) python3 -m bert_jax.benchmark --gpu", text)
  return float(deadline), float(timeout)


def test_the_h100_plan_fits_nine_minutes_and_drops_variants_first():
  """tools/gpu/device_run.sh's plan on the H100 estimates: every shape on both sides and the
  profile of our Base step are admitted, the variants fill what is left in their order, and
  the command (the deadline, the parent's grace, the set-up around it) stays under 9 min."""
  deadline, timeout = _device_run_limits()
  assert deadline + gpu.GRACE_S + 5 <= timeout and timeout + 15 <= 9 * 60
  plans = gpu_plan.make_plans()
  taken, left, sim = gpu_plan.admit(plans, deadline, steps=10, reps=3, warmup=3, compile_threads=3)
  assert sim["end_s"] <= deadline
  assert all(p["role"] == "variant" for p in left)
  assert {p["id"] for p in plans if p["role"] != "variant"} <= {p["id"] for p in taken}
  admitted = [p["variant"] for p in taken if p["role"] == "variant" and p["side"] == "ours"]
  assert admitted[:3] == [{"dropout_rng": "hash"}, {"dropout_rng": "rbg"},
                          {"attention_impl": "flash"}]  # fmt: skip
  assert len(admitted) >= 5
  # Ours start with the longest compiles (the Large shapes), the variants after the shapes.
  order = gpu_plan.build_order(taken)
  assert [(p["size"], p["seq"]) for p in order[:3]] == [
    ("large", 512),
    ("large", 128),
    ("base", 128),
  ]
  assert all(p["role"] == "variant" for p in order[3:])
  starts = [sim["at"][p["id"]][0] for p in order]
  assert starts[:3] == sorted(starts[:3])
  # A tight deadline leaves out variants, never a shape, and a profile only with its step.
  taken, left, _ = gpu_plan.admit(plans, 400, steps=10, reps=3, warmup=3, compile_threads=3)
  assert {p["role"] for p in left} <= {"variant", "profile"}
  assert [p["role"] for p in taken if p["side"] == "ours"][:3] == ["shape"] * 3
  taken, left, _ = gpu_plan.admit(plans, 0, steps=10, reps=3, warmup=3, compile_threads=3)
  assert taken == [] and len(left) == len(plans)


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


def test_gpu_build_under_slow_preparation_keeps_every_shape(capsys):
  """Our worker when preparing each plan takes longer than planned (the H100 run's failure):
  every shape still builds and is timed, the variants are dropped instead; a variant with an
  unknown model field or XLA option, or a model field value that does not exist in this
  checkout (e.g. a kernel another branch adds), is one error line and the rest go on; an XLA
  option reaches that executable only."""
  plans = [
    _plan(0, "shape", seq=16),
    _plan(1, "shape", seq=8),
    _plan(2, "variant", {"xla_gpu_autotune_level": 0}),
    _plan(3, "variant", {"no_such_field": 1}),
    _plan(4, "variant", {"attention_impl": "no_such_impl"}),
    _plan(5, "variant", {"xla_no_such_option": 1}),
    _plan(6, "variant", {"xla_gpu_autotune_level": 0}, seq=4),
  ]
  t0 = time.time()
  spec = dict(plans=plans, build_until=t0 + 1e6, compile_threads=2, prepare_delay_s=0.0,
              build_order=[p["id"] for p in plans])  # fmt: skip
  built = gpu_ours.build(spec, prepare=_stand_in_prepare)
  by_id = {r["id"]: r for r in _records(capsys.readouterr().out)}
  # With time to spare: every valid plan builds; each bad one is one error line.
  assert sorted(p["id"] for p, _ in built) == ["ours0", "ours1", "ours2", "ours6"]
  assert by_id["ours3"]["error"] == (
    "ValueError: --variants key 'no_such_field' is not a BertConfig field"
  )
  assert by_id["ours4"]["error"].startswith("ValueError: attention_impl must be one of")
  assert by_id["ours5"]["kind"] == "error" and "xla_no_such_option" in by_id["ours5"]["error"]
  assert all(by_id[f"ours{i}"]["kind"] == "built" for i in (0, 1, 2, 6))
  # Slow preparation: 0.4 s a plan against a build deadline 0.6 s away. Both shapes build
  # (the second starts past the deadline), every variant is dropped.
  t0 = time.time()
  spec.update(build_until=t0 + 0.6, prepare_delay_s=0.4, end_by=t0 + 1e6, steps=2, reps=2,
              warmup=1, plans=plans + [dict(_plan(7, "profile"), of="ours1")])  # fmt: skip
  built = gpu_ours.build(spec, prepare=_stand_in_prepare)
  assert sorted(p["id"] for p, _ in built) == ["ours0", "ours1"]
  first = _records(capsys.readouterr().out)
  assert [(r["id"], r["kind"]) for r in first if r["kind"] == "built"] != []
  assert {r["id"]: r["why"] for r in first if r["kind"] == "skipped"} == {
    f"ours{i}": "build deadline" for i in (2, 3, 4, 5, 6)
  }
  assert all(st.state is None for _, st in built)  # no state before its timing
  gpu_ours.time_built(spec, built, gpu_ours._matmuls(8))
  recs = _records(capsys.readouterr().out)
  assert [r["kind"] for r in recs] == ["peak", "step", "step", "profile"]
  assert [r["id"] for r in recs[1:3]] == ["ours1", "ours0"]  # the smaller shape first
  for r in recs[1:3]:
    assert len(r["step_s_all"]) == 2 and r["step_s"] == min(r["step_s_all"])
    assert len(r["losses"]) == 2 and r["losses"][1] < r["losses"][0]  # w shrinks each step
  assert recs[3]["of"] == "ours1" and recs[3]["device_ms"] > 0


def test_gpu_cli_dry_run_prints_the_plan_and_empty_variants_mean_none(tmp_path):
  def plan(*extra):
    out = tmp_path / f"plan{len(extra)}.jsonl"
    argv = [sys.executable, "-m", "bert_jax.benchmark", "--gpu", "--dry_run", f"--json_out={out}"]
    proc = subprocess.run(argv + list(extra), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    return proc.stdout, recs

  stdout, recs = plan()
  (p,) = [r for r in recs if r["kind"] == "gpu_plan"]
  assert any(x["role"] == "variant" for x in p["plans"])
  # Our variants that do not fit wait on standby (built only if time is left), not skipped.
  assert p["standby"] and not {x["id"] for x in p["plans"]} & set(p["standby"])
  assert all(i.startswith("ours") for i in p["standby"])
  assert not {r["id"] for r in recs if r["kind"] == "skipped"} & set(p["standby"])
  assert "| 0 | ours bert_jax pretrain base 128 x 256 | shape |" in stdout
  assert "planned end" in stdout
  stdout, recs = plan("--variants=", "--shapes=base128,large512", "--torch_modes=")
  (p,) = [r for r in recs if r["kind"] == "gpu_plan"]
  assert [(x["role"], x["size"], x["seq"]) for x in p["plans"]] == [
    ("shape", "base", 128), ("shape", "large", 512), ("profile", "base", 128)
  ]  # fmt: skip
  assert p["standby"] == [] and not [r for r in recs if r["kind"] == "skipped"]


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
    assert r["mfu_measured_peak"] == pytest.approx(r["tflops"] / peak["tflops"])
    assert r["mfu_measured_peak_f32out"] == pytest.approx(r["tflops"] / peak["tflops_f32out"])
  assert {r["side"] for r in steps} == ({"ours", "torch"} if torch_side else {"ours"})
  table = gpu.format_gpu_table(records)
  assert "| pretrain | tiny | 128 x 8 | bert_jax | - |" in table
  assert "| finetune | tiny | 128 x 8 | bert_jax | - |" in table
  return table


@pytest.mark.slow
def test_gpu_smoke_run_on_cpu(tmp_path):
  """`--gpu_smoke`'s plumbing end to end at BERT-tiny: both workers build in parallel (ours
  with each preparation slowed), PyTorch's times first, then ours, then the profile of our
  first shape; rates, FLOPs, MFU, the table (PyTorch eager only: torch.compile on this CPU
  takes minutes; no PyTorch side without torch)."""
  torch_side = _peer_python() is not None
  out = tmp_path / "gpu.jsonl"
  records = gpu.run_gpu(
    smoke=True, deadline_s=900, variants=[{"no_such_field": 1}], torch_modes=["eager"],
    steps=1, reps=2, warmup=1, compile_threads=2, peer_python=_peer_python() or sys.executable,
    json_out=str(out), prepare_delay_s=2.0,
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
  # Every build ended before any step was timed, PyTorch's steps before ours.
  t_built = max(r["t_s"] for r in records if r["kind"] == "built")
  t_steps = [(r["t_s"], r["side"]) for r in records if r["kind"] in ("peak", "step")]
  assert min(t for t, _ in t_steps) >= t_built
  assert [s for _, s in t_steps] == sorted((s for _, s in t_steps), key=lambda s: s == "ours")
  # The profile of our first shape, from a real trace of its step.
  (prof,) = [r for r in records if r["kind"] == "profile"]
  assert (prof["size"], prof["seq"], prof["batch"]) == ("tiny", 128, 8)
  assert prof["families_ms"]["matmuls"] > 0 and prof["families_ms"]["rng"] > 0
  assert prof["device_ms"] == pytest.approx(sum(prof["families_ms"].values()))
  assert "| matmuls (other dots) |" in table


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
