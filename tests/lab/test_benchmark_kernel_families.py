"""bert_jax.benchmark.kernel_families: both sides' kernels named alike, the H200 trace of our base
step, torch profiler traces."""

import pytest

from bert_jax.benchmark import kernel_families
from lab._benchmark import RUNS, _jsonl


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
