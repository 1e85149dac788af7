"""bert_jax.benchmark.profile: the profile of a traced CPU step by kernel family, GPU kernels
classified by HLO op or by name, the must-show summaries of the H200 run, the CPU reference.
(The kernel families themselves: test_benchmark_kernel_families.py.)"""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from bert_jax.benchmark import gpu
from bert_jax.benchmark import profile as benchmark_profile
from lab._benchmark import REPO, RUNS, _jsonl


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
  assert (
    "ours 77.0 s (lowering 7.8, compile 63.7, state init 5.5 beside it)"
    in gpu.format_compile_alone(alone)
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
