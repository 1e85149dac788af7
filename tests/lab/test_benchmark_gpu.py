"""bert_jax.benchmark.gpu, the GPU comparison (`--gpu`), run here on the CPU: FLOPs and MFU against
a hand count, the datasheet peaks, the dry run's plan, the smoke run of both workers, the device
script, the deadline. Our worker's build and timing phases are test_benchmark_gpu_ours.py, the
plan's test_benchmark_gpu_plan.py."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax.benchmark import (
  gpu,
  gpu_plan,
  kernel_families,
  sizes,
)
from lab._benchmark import DEVICE_RUN, _device_run_limits, _jsonl, _peer_python

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
