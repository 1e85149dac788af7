"""bert_jax.benchmark: a tiny run emits well-formed JSON; the fast paths change no maths."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import benchmark
from bert_jax import model as model_lib


def test_tiny_run_emits_sane_json(tmp_path):
  out = tmp_path / "bench.jsonl"
  records = benchmark.run_suite(
    ["tiny"],
    [64],
    batch=4,
    dtypes=["float32"],
    passes=1,
    steps=2,
    warmup=1,
    json_out=str(out),
    isolate=False,
  )
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  assert lines == json.loads(json.dumps(records))
  (r,) = lines
  assert r["kind"] == "train_step" and r["impl"] == "bert_jax" and r["size"] == "tiny"
  assert r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
  assert math.isclose(r["tokens_per_s"], 4 * 64 / (r["step_ms_median"] / 1e3), rel_tol=1e-9)
  cfg = model_lib.config_for_size("tiny")
  # MLM head at max_predictions(64) = 10 gathered positions, not at all 64.
  assert r["flops_per_token"] == model_lib.train_flops_per_token(cfg, 64, 10)
  assert math.isclose(r["gflops"], r["flops_per_token"] * r["tokens_per_s"] / 1e9, rel_tol=1e-9)
  assert 0 < r["mfu"] == r["mfu_fp32_peak"] < 1.5 and r["peak_gflops"]["float32"] > 1
  assert r["compile_s"] > 0 and 0.1 < r["peak_rss_gb"] < 24
  assert r["page_faults_per_step"] >= 0
  assert r["glibc_tunables"] == os.environ.get("GLIBC_TUNABLES", "")  # what this process read
  # Three steps (1 warm-up + 2 timed) of a fresh model: loss ~ ln(V) + ln(2), decreasing.
  assert len(r["losses"]) == 3
  assert abs(r["losses"][0] - (math.log(cfg.vocab_size) + math.log(2))) < 0.5
  summary = benchmark.summarize(records)
  assert summary[0]["ours_best_median"] == r["tokens_per_s"]
  table = benchmark.format_table(records, summary)
  assert "| tiny | 64 | bert_jax | float32 |" in table


def test_summary_ratios_take_best_mode_and_fastest_peer_per_pass():
  def rec(impl, dtype, tps, p):
    return dict(
      kind="train_step",
      impl=impl,
      size="base",
      seq=128,
      batch=32,
      dtype=dtype,
      variant={},
      tokens_per_s=tps,
      pass_=p,
      step_ms_min=1,
      step_ms_median=1,
      step_ms_max=1,
      compile_s=1,
      peak_rss_gb=1,
      gflops=1,
      load_avg=0,
    )

  records = []
  for p, (f32, b16, hf, torch) in enumerate([(100, 120, 50, 80), (90, 100, 60, 100)]):
    for r in (
      rec("bert_jax", "float32", f32, p),
      rec("bert_jax", "bfloat16", b16, p),
      rec("hf_flax", "float32", hf, p),
      rec("torch", "bfloat16", torch, p),
    ):
      r["pass"] = r.pop("pass_")
      records.append(r)
  (s,) = benchmark.summarize(records)
  assert [e["ratio_vs_fastest_peer"] for e in s["passes"]] == [1.5, 1.0]
  assert [e["ratio_vs_hf_flax_fp32"] for e in s["passes"]] == [120 / 50, 100 / 60]
  assert s["ratio_vs_fastest_peer_min"] == 1.0 and s["ratio_vs_fastest_peer_median"] == 1.25


def test_fast_and_plain_give_the_same_losses():
  # Fast: fused attention, pruned last layer (unrolled), or scan + full remat + fused q/k/v,
  # custom-VJP bf16 matmuls. Plain: explicit attention, unrolled, full last layer, separate
  # q/k/v, fp32. Same weights and batches, 20 steps.
  recs = benchmark.loss_check("tiny", steps=20, batch=4, seq=32)
  by = {(r["check"], r["dtype"]): r for r in recs}
  assert sorted(by) == [(c, d) for c in ("fast", "fast_scan") for d in ("bfloat16", "float32")]
  assert by["fast", "float32"]["fast"]["prune_last_layer"]
  assert not by["fast", "float32"]["plain"]["prune_last_layer"]
  assert by["fast_scan", "float32"]["fast"]["scan_layers"]
  assert not by["fast_scan", "float32"]["plain"]["scan_layers"]
  a = np.array(by["fast", "float32"]["plain_losses"])
  assert len(a) == 20 and a[-1] < a[0] - 0.5  # the check is over a moving loss curve
  for check in ("fast", "fast_scan"):
    fp32, bf16 = by[check, "float32"], by[check, "bfloat16"]
    np.testing.assert_allclose(fp32["fast_losses"], a, rtol=2e-4)
    assert fp32["max_rel_diff"] < 2e-4
    # bf16 compute with fp32 params and accumulation: the same curve to bf16 tolerance.
    assert np.array_equal(bf16["plain_losses"], a) and bf16["dtype"] == "bfloat16"
    assert 0 < bf16["max_rel_diff"] < 3e-2


def test_parse_variants_types_values():
  got = benchmark.parse_variants(
    "scan_layers=True,remat_policy=full;hidden_dropout_prob=0.0,num_layers=3"
  )
  assert got == [
    {"scan_layers": True, "remat_policy": "full"},
    {"hidden_dropout_prob": 0.0, "num_layers": 3},
  ]
  assert isinstance(got[1]["num_layers"], int) and isinstance(got[1]["hidden_dropout_prob"], float)
  with pytest.raises(ValueError, match="not key=value"):
    benchmark.parse_variants("scan_layers")


def test_thp_malloc_env_keeps_the_callers_tunables(monkeypatch):
  monkeypatch.setattr(benchmark, "thp_available", lambda: True)
  assert benchmark.with_thp_malloc({"A": "1"}) == {
    "A": "1",
    "GLIBC_TUNABLES": benchmark.THP_TUNABLE,
  }
  got = benchmark.with_thp_malloc({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
  assert got["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + benchmark.THP_TUNABLE
  mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
  assert benchmark.with_thp_malloc(mine) == mine
  monkeypatch.setattr(benchmark, "thp_available", lambda: False)
  assert benchmark.with_thp_malloc({"A": "1"}) == {"A": "1"}


_FAULTS_CHILD = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):  # 64 MB blocks: malloc maps each afresh (numpy would madvise by itself)
  p = libc.malloc(64 << 20)
  ctypes.memset(p, 1, 64 << 20)
  libc.free(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_thp_malloc_env_cuts_page_faults():
  """The tunable takes effect: 8 fresh 64 MB blocks fault 4 KB pages in, or 2 MB ones."""
  if not benchmark.thp_available():
    pytest.skip("the kernel offers no transparent huge pages")
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}

  def faults(e):
    out = subprocess.run([sys.executable, "-c", _FAULTS_CHILD], env=e, capture_output=True)
    return int(out.stdout)

  libc, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
  if libc != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
    pytest.skip(f"{benchmark.THP_TUNABLE} needs glibc >= 2.35, not {libc} {version}")
  plain, thp = faults(env), faults(benchmark.with_thp_malloc(env))
  assert plain > 8 * 16_000  # 64 MB is 16,384 pages of 4 KB
  assert thp < plain / 20  # 2 MB pages, bar the unaligned ends of each block


def test_lockstep_times_the_fast_mode_of_this_cpu(monkeypatch):
  """Without --dtypes, --lockstep times bf16 where the CPU has bf16 instructions (our faster
  mode there), float32 elsewhere; an explicit --dtypes wins."""
  monkeypatch.setattr(benchmark, "cpu_has_bf16", lambda: True)
  assert benchmark.lockstep_dtype(None) == "bfloat16"
  assert benchmark.lockstep_dtype(["float32", "bfloat16"]) == "float32"
  monkeypatch.setattr(benchmark, "cpu_has_bf16", lambda: False)
  assert benchmark.lockstep_dtype(None) == "float32"
  assert benchmark.lockstep_dtype([]) == "float32"


def test_lockstep_rounds_alternate_who_goes_first_and_settle_each_turn():
  calls = []

  class Fake:
    def __init__(self, name, secs):
      self.name, self.secs = name, secs

    def step(self, settle=False):
      calls.append(self.name + ("s" if settle else ""))
      return self.secs

  got = benchmark.lockstep_rounds(Fake("a", 0.4), Fake("b", 1.0), 3, 1.0, settle_steps=1)
  # a's turn: a settle step, then timed 0.4 s steps until 1 s (3 of them); b's: one 1 s step.
  a_turn, b_turn = ["as", "a", "a", "a"], ["bs", "b"]
  assert calls == a_turn + b_turn + b_turn + a_turn + a_turn + b_turn
  assert got["a_turns"] == [(3, pytest.approx(1.2))] * 3 and got["b_turns"] == [(1, 1.0)] * 3
  assert got["a_settle_s"] == [0.4] * 3 and got["b_settle_s"] == [1.0] * 3


def test_lockstep_worker_that_hangs_is_killed_with_a_one_line_error():
  hang = [sys.executable, "-c", "import time; time.sleep(600)"]
  with pytest.raises(RuntimeError, match=r"^lockstep worker sleeper timed out after 2 s"):
    benchmark._LockstepWorker("sleeper", hang, timeout=2)


def test_lockstep_runs_live_workers_turn_by_turn():
  """Ours against ours (an A/A run): each worker compiles once, then steps on request."""
  peer_specs = []

  def self_as_peer(pspec):
    spec = dict(size="tiny", seq=32, batch=2, dtype="float32", steps=0, warmup=1)
    spec.update(variant=dict(benchmark.FAST), serve=True, peak=False)
    peer_specs.append(pspec)
    return benchmark._ours_argv(spec)

  def dies(pspec):
    return [sys.executable, "-c", "import sys; print('no model here', file=sys.stderr); exit(3)"]

  peers = [("hf_flax", "float32"), ("torch", "float32")]
  argv_for = {"hf_flax": self_as_peer, "torch": dies}
  recs = benchmark.measure_lockstep(
    "tiny", 32, 2, "float32", rounds=3, warmup=1, peers=peers, peer_python=sys.executable,
    peer_argv=lambda pspec: argv_for[pspec["framework"]](pspec), min_turn_s=0.5,
  )  # fmt: skip
  kinds = [r["kind"] for r in recs]
  assert kinds == ["lockstep", "train_step", "error", "train_step"], kinds
  lock, peer, err, ours = recs
  assert peer_specs[0]["serve"] and peer_specs[0]["framework"] == "hf_flax"
  assert lock["peer"] == "hf_flax:float32" and lock["rounds"] == 3
  assert len(lock["ours_turns"]) == len(lock["peer_turns"]) == 3
  # Each turn: whole steps until min_turn_s=0.5 s passed; ratio of tokens/s round by round.
  tps = {k: [n * 2 * 32 / t for n, t in lock[k]] for k in ("ours_turns", "peer_turns")}
  assert lock["ratio_per_round"] == [
    o / p for o, p in zip(tps["ours_turns"], tps["peer_turns"], strict=True)
  ]
  assert lock["ratio_min"] <= lock["ratio_median"] <= lock["ratio_max"]
  assert 0.2 < lock["ratio_median"] < 5  # the same step on both sides
  for n, t in lock["ours_turns"] + lock["peer_turns"]:
    assert n >= 1 and t >= 0.5
  # Each turn opens with one untimed settle step: run (a loss) but not in the times.
  assert len(peer["step_s"]) == sum(n for n, _ in lock["peer_turns"])
  assert len(peer["losses"]) == 1 + 3 + len(peer["step_s"])
  assert len(lock["ours_settle_s"]) == len(lock["peer_settle_s"]) == 3
  assert "exited (3) early" in err["error"] and "no model here" in err["error"]
  # Ours stayed up through both peers: only the rounds it was asked for, then its record.
  assert ours["impl"] == "bert_jax"
  assert math.isclose(sum(ours["step_s"]), sum(t for _, t in lock["ours_turns"]))
  assert len(ours["losses"]) == 1 + 3 + len(ours["step_s"])  # warm-up, settle, timed
  assert 0 < ours["mfu"] < 1.5 and ours["page_faults_per_step"] >= 0
  table = benchmark.format_lockstep([{**lock, "pass": 0}])
  assert "| tiny | 32 | 0 | hf_flax:float32 | 3 |" in table


def test_lockstep_without_peers_is_a_one_line_error():
  proc = subprocess.run(
    [sys.executable, "-m", "bert_jax.benchmark", "--sizes=tiny", "--lockstep"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
    "benchmark: error: --lockstep needs --peers (with an importable peer) and --isolate"
  )
