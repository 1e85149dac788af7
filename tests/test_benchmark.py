"""bert_jax.benchmark: our step is the trainer's, a tiny run emits well-formed JSON, the
summaries pick the right ratios, the lockstep choreography, the peer side's isolation from
bert_jax, and the huge-page malloc tunable."""

import ast
import importlib.util
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
import numpy as np
import pytest

from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax import train
from bert_jax.benchmark import (
  batches,
  data,
  finetune_step,
  gpu,
  gpu_ours,
  gpu_plan,
  host,
  lockstep,
  measure,
  memory,
  peer_worker,
  peers,
  protocol,
  sizes,
  step,
  suite,
  tables,
)
from bert_jax.benchmark import profile as benchmark_profile

PACKAGE = pathlib.Path(step.__file__).parent


# ----------------------------------------------------------------------------- step + suite


def test_build_step_is_the_trainers_jitted_step(monkeypatch):
  calls = []

  def spy(name):
    fn = getattr(train, name)

    def called(*args, **kwargs):
      calls.append(name)
      return fn(*args, **kwargs)

    monkeypatch.setattr(train, name, called)

  spy("abstract_state")
  spy("jit_train_step")
  spy("state_init_fn")
  spy("create_state")
  config = step.bench_config("tiny", 32, 2, "float32", {"hidden_dropout_prob": 0.0})
  s = step.build_step(config)
  # Lowered against the abstract state (which traces state_init_fn abstractly); the state made
  # by create_state's own init (state_init_fn under sharding.sharded_init), compiled with the
  # step and run after it; create_state itself (init compiled and run first) never.
  assert calls == ["abstract_state", "state_init_fn", "jit_train_step", "state_init_fn"]
  assert s.init is not None and s.init_compile_s > 0
  # The trainer's model config, its kernels resolved for this (CPU) backend as train does.
  assert s.cfg == model_lib.resolve_kernels(train.bert_config(config), "cpu")
  assert s.cfg.kernels == "cpu" and s.cfg.hidden_dropout_prob == 0.0
  _, losses = step.run_steps(s, 2)
  # A fresh model: MLM over the vocab + NSP, ~ ln(V) + ln(2); one AdamW step lowers it.
  assert abs(losses[0] - (math.log(s.cfg.vocab_size) + math.log(2))) < 0.5
  assert losses[1] < losses[0]
  with pytest.raises(ValueError, match="'nope' is not a BertConfig field"):
    step.bench_config("tiny", 32, 2, "float32", {"nope": 1})


def test_kernel_variants_are_model_fields():
  assert step.bench_config("tiny", 32, 2, "float32", {}).model.kernels == "auto"
  for variant, kernels in ((step.FAST, "cpu"), (step.PLAIN, "xla")):
    config = step.bench_config("tiny", 32, 2, "float32", variant)
    assert config.model.kernels == kernels
    # An explicit setting is what runs, on any backend.
    assert model_lib.resolve_kernels(train.bert_config(config), "tpu").kernels == kernels


def test_tiny_run_emits_sane_json(tmp_path):
  out = tmp_path / "bench.jsonl"
  records = suite.run_suite(
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
  assert r["variant"] == {} and r["kernels"] == "cpu"  # the trainer's default on CPU
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
  summary = tables.summarize(records)
  assert summary[0]["ours_best_median"] == r["tokens_per_s"]
  table = tables.format_table(records, summary)
  assert "| tiny | 64 | bert_jax | float32 | - |" in table


def test_parse_variants_types_values():
  got = suite.parse_variants(
    "scan_layers=True,remat_policy=full;hidden_dropout_prob=0.0,num_layers=3"
  )
  assert got == [
    {"scan_layers": True, "remat_policy": "full"},
    {"hidden_dropout_prob": 0.0, "num_layers": 3},
  ]
  assert isinstance(got[1]["num_layers"], int) and isinstance(got[1]["hidden_dropout_prob"], float)
  assert suite.parse_variants("kernels=xla") == [step.PLAIN]
  with pytest.raises(ValueError, match="not key=value"):
    suite.parse_variants("scan_layers")


def test_memory_record_counts_params_four_times_and_xla_buffers():
  params = {"w": jnp.zeros((256, 128), jnp.float32), "b": jnp.zeros((128,), jnp.float32)}
  compiled = jax.jit(lambda p: jax.tree.map(lambda x: x * 2, p), donate_argnums=0)
  rec = memory.memory_record(compiled.lower(params).compile(), params)
  n_bytes = 4 * (256 * 128 + 128)
  assert rec["param_gb"] == n_bytes / 1e9 and rec["params_grads_adam_gb"] == 4 * n_bytes / 1e9
  assert rec["xla_argument_gb"] == pytest.approx(n_bytes / 1e9)
  # Donated: the outputs alias the arguments, so the peak counts them once.
  assert rec["xla_alias_gb"] == pytest.approx(n_bytes / 1e9)
  assert rec["xla_peak_gb"] == pytest.approx(
    rec["xla_argument_gb"] + rec["xla_output_gb"] - rec["xla_alias_gb"] + rec["xla_temp_gb"]
  )
  assert rec["xla_peak_gb"] < 1.5 * n_bytes / 1e9
  assert rec["xla_peak_ratio"] == pytest.approx(rec["xla_peak_gb"] / rec["params_grads_adam_gb"])


def test_large_measurement_path_on_a_tiny_model():
  """--large's measurement (scanned layers, full remat, XLA's memory accounting), at tiny."""
  spec = {**memory.large_spec(batch=2), "size": "tiny", "seq": 32}
  rec = measure.measure_ours(**spec)
  assert rec["variant"] == memory.LARGE_VARIANT and len(rec["step_s"]) == 2
  assert "mfu" not in rec  # no matmul peak for this one
  n_params = model_lib.count_params(model_lib.abstract_params(model_lib.config_for_size("tiny")))
  assert rec["param_gb"] == pytest.approx(4 * n_params / 1e9)
  # The state (params + 2 Adam moments) is an argument; the peak holds at least it.
  assert rec["xla_argument_gb"] >= 3 * rec["param_gb"]
  assert rec["xla_peak_gb"] >= rec["xla_argument_gb"]
  assert rec["peak_rss_ratio"] == rec["peak_rss_gb"] / rec["params_grads_adam_gb"]


def test_data_throughput_record():
  rec = data.measure_data(seq=64, batch=8, batches=5)
  assert rec["kind"] == "data" and rec["corpus_bytes"] > 100_000
  assert rec["create_data_tokens_per_s"] > rec["create_data_sequences_per_s"] > 0
  assert rec["pipeline_tokens_per_s"] == pytest.approx(rec["pipeline_batches_per_s"] * 8 * 64)
  assert 0 <= rec["padding_fraction"] < 0.5


# ----------------------------------------------------------------------------- tables


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
      step_ms_min=1,
      step_ms_median=1,
      step_ms_max=1,
      compile_s=1,
      peak_rss_gb=1,
      gflops=1,
      load_avg=0,
      **{"pass": p},
    )

  records = []
  for p, (f32, b16, hf, torch) in enumerate([(100, 120, 50, 80), (90, 100, 60, 100)]):
    records += [
      rec("bert_jax", "float32", f32, p),
      rec("bert_jax", "bfloat16", b16, p),
      rec("hf_flax", "float32", hf, p),
      rec("torch", "bfloat16", torch, p),
    ]
  # A variant measured beside the default does not count as "ours best".
  records.append({**rec("bert_jax", "float32", 1000, 0), "variant": step.PLAIN})
  (s,) = tables.summarize(records)
  assert [e["ratio_vs_fastest_peer"] for e in s["passes"]] == [1.5, 1.0]
  assert [e["ratio_vs_hf_flax_fp32"] for e in s["passes"]] == [120 / 50, 100 / 60]
  assert s["ratio_vs_fastest_peer_min"] == 1.0 and s["ratio_vs_fastest_peer_median"] == 1.25
  assert [e["fastest_peer"] for e in s["passes"]] == ["torch:bfloat16", "torch:bfloat16"]
  table = tables.format_table(records, [s])
  assert "| base | 128 | bert_jax | float32 | kernels=xla | 0 | 1000 |" in table
  assert "| base | 128 | 110 | 1.00 / 1.25 | 1.67 / 2.03 |" in table


# ----------------------------------------------------------------------------- host


def test_thp_malloc_env_keeps_the_callers_tunables(monkeypatch):
  monkeypatch.setattr(host, "thp_available", lambda: True)
  assert host.with_thp_malloc({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": host.THP_TUNABLE}
  got = host.with_thp_malloc({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
  assert got["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + host.THP_TUNABLE
  mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
  assert host.with_thp_malloc(mine) == mine
  monkeypatch.setattr(host, "thp_available", lambda: False)
  assert host.with_thp_malloc({"A": "1"}) == {"A": "1"}


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
  if not host.thp_available():
    pytest.skip("the kernel offers no transparent huge pages")
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}

  def faults(e):
    out = subprocess.run([sys.executable, "-c", _FAULTS_CHILD], env=e, capture_output=True)
    return int(out.stdout)

  libc, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
  if libc != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
    pytest.skip(f"{host.THP_TUNABLE} needs glibc >= 2.35, not {libc} {version}")
  plain, thp = faults(env), faults(host.with_thp_malloc(env))
  assert plain > 8 * 16_000  # 64 MB is 16,384 pages of 4 KB
  assert thp < plain / 20  # 2 MB pages, bar the unaligned ends of each block


def test_bf16_is_timed_only_where_the_cpu_has_it(monkeypatch):
  """Without --dtypes, our dtypes and the peers follow the CPU; --lockstep times bf16 where
  the CPU has bf16 instructions (our faster mode there), float32 elsewhere; --dtypes wins."""
  monkeypatch.setattr(host, "cpu_has_bf16", lambda: True)
  assert host.default_dtypes() == ["float32", "bfloat16"]
  assert peers.default_peers() == list(peers.PEERS_FP32 + peers.PEERS_BF16)
  assert lockstep.lockstep_dtype(None) == "bfloat16"
  assert lockstep.lockstep_dtype(["float32", "bfloat16"]) == "float32"
  monkeypatch.setattr(host, "cpu_has_bf16", lambda: False)
  assert host.default_dtypes() == ["float32"]
  assert peers.default_peers() == list(peers.PEERS_FP32)
  assert lockstep.lockstep_dtype(None) == "float32"
  assert lockstep.lockstep_dtype([]) == "float32"


# ----------------------------------------------------------------------------- peers


def _module_imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
  """Top-level module names a file imports (unconditionally, and under `if __package__`)."""
  always, in_package = set(), set()
  for node in ast.parse(path.read_text()).body:
    blocks = [(node, always)]
    if isinstance(node, ast.If):
      is_pkg = ast.unparse(node.test) == "__package__"
      blocks = [(n, in_package if is_pkg else always) for n in node.body]
      blocks += [(n, always) for n in node.orelse]
    for n, into in blocks:
      if isinstance(n, ast.Import):
        into.update(a.name.split(".")[0] for a in n.names)
      elif isinstance(n, ast.ImportFrom) and n.module:
        into.add(n.module.split(".")[0])
  return always, in_package


def test_peer_side_files_run_without_bert_jax():
  """The peer interpreter runs peer_worker.py by path: at module level it and its siblings
  import only the standard library, numpy and each other (bert_jax only as a package)."""
  stdlib = set(sys.stdlib_module_names) | {"__future__"}
  for name in ("host.py", "protocol.py"):
    always, _ = _module_imports(PACKAGE / name)
    assert always <= stdlib, (name, always - stdlib)
  always, _ = _module_imports(PACKAGE / "batches.py")
  assert always - stdlib == {"numpy"}
  always, in_package = _module_imports(PACKAGE / "peer_worker.py")
  assert always - stdlib == {"numpy", "host", "protocol", "batches"}
  assert in_package == {"bert_jax"}
  assert peers.peer_argv("PY", {"a": 1}) == ["PY", str(PACKAGE / "peer_worker.py"), '{"a": 1}']


def _peer_python() -> str | None:
  """An interpreter with torch and transformers: $BERT_JAX_PEER_PYTHON, or this one."""
  python = os.environ.get("BERT_JAX_PEER_PYTHON", sys.executable)
  return python if peers.peer_available(python)["torch"] else None


def test_torch_peer_times_a_fresh_bert():
  python = _peer_python()
  if python is None:
    pytest.skip("no interpreter with torch and transformers (set BERT_JAX_PEER_PYTHON)")
  rec = peers.measure_peer(python, "torch", "float32", "tiny", 32, 2, steps=2, warmup=1)
  assert rec["impl"] == "torch" and rec["size"] == "tiny" and len(rec["step_s"]) == 2
  assert len(rec["losses"]) == 3 and "torch" in rec["versions"]
  # HF's loss: MLM over the vocab + NSP, ~ ln(V) + ln(2) for a fresh model.
  cfg = model_lib.config_for_size("tiny")
  assert abs(rec["losses"][0] - (math.log(cfg.vocab_size) + math.log(2))) < 0.5
  # The peers' FLOPs count the MLM head at every position.
  assert rec["flops_per_token"] == model_lib.train_flops_per_token(cfg, 32, 32)


# ----------------------------------------------------------------------------- lockstep


def test_lockstep_rounds_alternate_who_goes_first_and_settle_each_turn():
  calls = []

  class Fake:
    def __init__(self, name, secs):
      self.name, self.secs = name, secs

    def step(self, settle=False):
      calls.append(self.name + ("s" if settle else ""))
      return self.secs

  got = lockstep.lockstep_rounds(Fake("a", 0.4), Fake("b", 1.0), 3, 1.0, settle_steps=1)
  # a's turn: a settle step, then timed 0.4 s steps until 1 s (3 of them); b's: one 1 s step.
  a_turn, b_turn = ["as", "a", "a", "a"], ["bs", "b"]
  assert calls == a_turn + b_turn + b_turn + a_turn + a_turn + b_turn
  assert got["a_turns"] == [(3, pytest.approx(1.2))] * 3 and got["b_turns"] == [(1, 1.0)] * 3
  assert got["a_settle_s"] == [0.4] * 3 and got["b_settle_s"] == [1.0] * 3


def test_lockstep_worker_that_hangs_is_killed_with_a_one_line_error():
  hang = [sys.executable, "-c", "import time; time.sleep(600)"]
  with pytest.raises(RuntimeError, match=r"^lockstep worker sleeper timed out after 2 s"):
    lockstep.LockstepWorker("sleeper", hang, timeout=2)


def test_lockstep_runs_live_workers_turn_by_turn():
  """Ours against ours (an A/A run): each worker compiles once, then steps on request."""
  peer_specs = []

  def self_as_peer(pspec):
    spec = dict(size="tiny", seq=32, batch=2, dtype="float32", steps=0, warmup=1)
    spec.update(serve=True, peak=False)
    peer_specs.append(pspec)
    return measure.ours_argv(spec)

  def dies(pspec):
    return [sys.executable, "-c", "import sys; print('no model here', file=sys.stderr); exit(3)"]

  peer_list = [("hf_flax", "float32"), ("torch", "float32")]
  argv_for = {"hf_flax": self_as_peer, "torch": dies}
  recs = lockstep.measure_lockstep(
    "tiny", 32, 2, "float32", rounds=3, warmup=1, peer_list=peer_list,
    peer_python=sys.executable, peer_argv=lambda pspec: argv_for[pspec["framework"]](pspec),
    min_turn_s=0.5,
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
  assert err["impl"] == "torch" and err["size"] == "tiny"
  # Ours stayed up through both peers: only the rounds it was asked for, then its record.
  assert ours["impl"] == "bert_jax" and ours["variant"] == {} and ours["kernels"] == "cpu"
  assert math.isclose(sum(ours["step_s"]), sum(t for _, t in lock["ours_turns"]))
  assert len(ours["losses"]) == 1 + 3 + len(ours["step_s"])  # warm-up, settle, timed
  assert 0 < ours["mfu"] < 1.5 and ours["page_faults_per_step"] >= 0
  table = tables.format_lockstep([{**lock, "pass": 0}])
  assert "| tiny | 32 | 0 | hf_flax:float32 | 3 |" in table


# ----------------------------------------------------------------------------- CLI


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
  assert proc.stdout == ""  # nothing measured, not even the host record


# ----------------------------------------------------------------------------- fine-tuning


def test_minilm_size_and_finetune_flops():
  cfg = sizes.config_for_size("minilm")
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (6, 384, 12)
  assert (cfg.intermediate_size, cfg.vocab_size) == (1536, 30522)  # all-MiniLM-L6-v2's shape
  assert sizes.config_for_size("base") == model_lib.config_for_size("base")
  with pytest.raises(ValueError, match=r"^--sizes: unknown size 'huge'; choose from tiny, "):
    sizes.size_fields("huge")
  assert step.bench_config("minilm", 128, 2, "float32", {}).model.hidden_size == 384
  # tiny (2 layers, d 128, f 512) at seq 32, by hand: a layer 6 (4 d^2 + 2 d f) + 12 d L
  # = 6 (65,536 + 131,072) + 49,152 = 1,228,800; pooler + 2-way classifier once per sequence
  # 6 (d^2 + 2 d) / L = 3,120; no MLM head.
  tiny = sizes.config_for_size("tiny")
  assert sizes.finetune_flops_per_token(tiny, 32) == 2 * 1_228_800 + 3_120
  assert sizes.finetune_flops_per_token(tiny, 32, 3) == 2 * 1_228_800 + 3_120 + 6 * 128 / 32


def test_pair_batch_is_the_batch_of_both_sides():
  b = batches.pair_batch(3, 8, 30522, seed=5)
  assert b["input_ids"].shape == (3, 8) and b["input_ids"].dtype == np.int32
  assert (b["input_ids"][:, [0, 3, 7]] == [101, 102, 102]).all()
  assert (b["segment_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]).all() and b["input_mask"].all()
  assert set(b["label"]) <= {0, 1} and b["label"].shape == (3,)
  again = batches.pair_batch(3, 8, 30522, seed=5)
  assert all((b[k] == again[k]).all() for k in b)
  # The pretraining step times the same arrays (its NSP label is the pair's label), and the
  # peer worker builds its fine-tuning batch with this very function.
  pre = step.synthetic_batch(3, 8, 30522, seed=5)
  assert (pre["input_ids"] == b["input_ids"]).all() and (
    pre["next_sentence_label"] == b["label"]
  ).all()
  assert peer_worker.batches.pair_batch is batches.pair_batch


def test_finetune_peers_are_pytorch_only(monkeypatch):
  for bf16 in (False, True):
    monkeypatch.setattr(host, "cpu_has_bf16", lambda bf16=bf16: bf16)
    expected = ["torch:float32", "torch_compile:float32"]
    expected += ["torch:bfloat16", "torch_compile:bfloat16"] if bf16 else []
    assert peers.default_peers("finetune") == expected
    assert "hf_flax:float32" in peers.default_peers()
  spec = peers.peer_spec("torch", "float32", "minilm", 128, 32, task="finetune")
  assert spec["task"] == "finetune" and spec["num_labels"] == 2
  assert (spec["layers"], spec["hidden"], spec["heads"], spec["intermediate"]) == (6, 384, 12, 1536)


def _ft_rec(impl, dtype, examples_per_s, p=0, seq=128):
  return dict(
    kind="train_step", task="finetune", impl=impl, size="minilm", seq=seq, batch=32,
    dtype=dtype, variant={}, tokens_per_s=examples_per_s * seq,
    examples_per_s=examples_per_s, step_ms_min=1, step_ms_median=1, step_ms_max=1,
    compile_s=1, peak_rss_gb=1, gflops=1, load_avg=0, **{"pass": p},
  )  # fmt: skip


def test_finetune_tables_count_examples_per_second():
  records = [
    _ft_rec("bert_jax", "float32", 60),
    _ft_rec("torch", "float32", 20),
    _ft_rec("torch_compile", "float32", 30),
  ]
  # A pretraining record of the same size and seq is summarised apart.
  records.append({**_ft_rec("bert_jax", "float32", 1000), "task": "pretrain"})
  summaries = tables.summarize(records)
  ft = next(s for s in summaries if s["task"] == "finetune")
  assert ft["ratio_vs_fastest_peer_median"] == 2.0 and ft["ours_best_examples_per_s_median"] == 60
  assert ft["passes"][0]["fastest_peer"] == "torch_compile:float32"
  assert next(s for s in summaries if s["task"] == "pretrain")["ours_best_median"] == 128_000
  table = tables.format_table(records[:3], [ft])
  assert "| examples/s |" in table.splitlines()[0]
  assert "| minilm | 128 | torch | float32 | - | 0 | 20.0 |" in table
  assert "| minilm | 128 | 60.0 | 2.00 / 2.00 | - |" in table
  lock = {
    "kind": "lockstep", "task": "finetune", "size": "minilm", "seq": 128, "pass": 0,
    "peer": "torch:float32", "rounds": 3, "ours_examples_per_s": 61.0,
    "peer_examples_per_s": 20.4, "ratio_min": 2.9, "ratio_median": 3.0, "ratio_max": 3.1,
  }  # fmt: skip
  assert "| minilm | 128 | 0 | torch:float32 | 3 | 61.0 | 20.4 | 2.90 / 3.00 / 3.10 |" in (
    tables.format_lockstep([lock])
  )


def test_torch_finetune_peer_times_a_fresh_classifier():
  python = _peer_python()
  if python is None:
    pytest.skip("no interpreter with torch and transformers (set BERT_JAX_PEER_PYTHON)")
  rec = peers.measure_peer(
    python, "torch", "float32", "tiny", 32, 2, steps=2, warmup=1, task="finetune"
  )
  assert rec["task"] == "finetune" and rec["impl"] == "torch" and len(rec["step_s"]) == 2
  assert rec["versions"]["attn_implementation"] == "sdpa"
  # A fresh 2-way classifier (weights ~ N(0, 0.02)): loss ~ ln 2.
  assert abs(rec["losses"][0] - math.log(2)) < 0.1
  assert rec["flops_per_token"] == sizes.finetune_flops_per_token(sizes.config_for_size("tiny"), 32)
  assert math.isclose(rec["examples_per_s"], 2 / (rec["step_ms_median"] / 1e3), rel_tol=1e-9)


def test_finetune_lockstep_passes_the_task_to_both_sides(monkeypatch):
  started = {}

  class Fake:
    def __init__(self, name, argv, timeout, env=None):
      started[name] = argv
      self.secs = {"bert_jax": 0.5}.get(name, 1.5)

    def step(self, settle=False):
      return self.secs

    def finish(self):
      return {"step_s": [self.secs], "losses": [0.7]}

    def close(self):
      pass

  monkeypatch.setattr(lockstep, "LockstepWorker", Fake)
  recs = lockstep.measure_lockstep(
    "minilm", 128, 32, "float32", rounds=2, warmup=1, peer_list=[("torch", "float32")],
    peer_python="PY", min_turn_s=1.0, task="finetune",
  )  # fmt: skip
  ours_spec = json.loads(started["bert_jax"][-1].removeprefix("--worker="))
  peer_spec = json.loads(started["torch:float32"][-1])
  assert ours_spec["task"] == peer_spec["task"] == "finetune" and ours_spec["serve"]
  assert peer_spec["hidden"] == 384 and peer_spec["num_labels"] == 2
  lock, peer, _ = recs
  assert lock["task"] == "finetune" and lock["ratio_median"] == 3.0
  # Turns of whole steps until 1 s: ours 2 steps of 0.5 s, the peer's one of 1.5 s.
  assert lock["ours_examples_per_s"] == 2 * 32 / 1.0 and lock["peer_examples_per_s"] == 32 / 1.5
  assert peer["task"] == "finetune" and peer["examples_per_s"] == 32 / 1.5


def test_finetune_mode_runs_with_the_peer_skipped_without_torch(tmp_path):
  """`--task=finetune` times the engine's step (tiny, in this process); a peer interpreter
  without torch is skipped with a note."""
  no_torch = tmp_path / "python"
  no_torch.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # no site-packages
  no_torch.chmod(0o755)
  out = tmp_path / "bench.jsonl"
  argv = [sys.executable, "-m", "bert_jax.benchmark", "--task=finetune", "--sizes=tiny"]
  argv += ["--seqs=32", "--batch=4", "--dtypes=float32", "--steps=2", "--warmup=1", "--passes=1"]
  argv += ["--noisolate"]
  argv += ["--peers", f"--peer_python={no_torch}", f"--json_out={out}"]
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  for fw in ("torch", "torch_compile"):
    assert f"benchmark: peer {fw} is not importable in {no_torch}; skipped" in proc.stderr
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  (r,) = [x for x in lines if x["kind"] == "train_step"]
  assert r["task"] == "finetune" and r["impl"] == "bert_jax" and r["kernels"] == "cpu"
  assert math.isclose(r["examples_per_s"], 4 / (r["step_ms_median"] / 1e3), rel_tol=1e-9)
  assert r["flops_per_token"] == sizes.finetune_flops_per_token(sizes.config_for_size("tiny"), 32)
  # A fresh 2-way classifier: cross-entropy ~ ln 2 on every step.
  assert len(r["losses"]) == 3 and all(abs(x - math.log(2)) < 0.1 for x in r["losses"])
  (s,) = [x for x in lines if x["kind"] == "summary"]
  assert s["task"] == "finetune" and s["ours_best_examples_per_s_median"] == r["examples_per_s"]
  assert "| tiny | 32 | bert_jax | float32 | - | 0 |" in proc.stdout
  assert "| examples/s |" in proc.stdout
  bad = subprocess.run(
    argv[:4] + ["--peers", f"--peer_python={no_torch}", "--peer_list=hf_flax:float32"],
    capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
    "benchmark: error: --peer_list: unknown peer 'hf_flax' for --task=finetune; use torch, "
    "torch_compile"
  )


def test_vmap_seeds_probe_steps_each_seed_as_its_own_step():
  """tools/probes/vmap_seeds_probe.py: seed k of the vmapped step gets seed k's single step."""
  spec = importlib.util.spec_from_file_location(
    "vmap_seeds_probe",
    pathlib.Path(__file__).parent.parent / "tools" / "probes" / "vmap_seeds_probe.py",
  )
  probe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(probe)
  config = finetune_step.bench_config("tiny", 16, 2, "float32", {})
  mesh = sh.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  with sh.mesh_context(mesh, sh.rules_from_config(config.mesh.rules)):
    single, multi, states, state_s, batch, batch_s, rngs = probe.build(config, 2)
    first = jax.tree.map(lambda x: np.asarray(x[0]), state_s)
    np.testing.assert_array_equal(
      first["params"]["head"]["classifier"]["kernel"],
      states[0]["params"]["head"]["classifier"]["kernel"],
    )
    assert not np.array_equal(
      first["params"]["head"]["classifier"]["kernel"],
      np.asarray(state_s["params"]["head"]["classifier"]["kernel"][1]),
    )
    state_s, m_s = multi(state_s, batch_s, rngs)
    for k in range(2):
      st, m = single(states[k], batch, rngs[k])
      np.testing.assert_allclose(m_s["loss"][k], m["loss"], rtol=1e-5)
      jax.tree.map(
        lambda a, b, k=k: np.testing.assert_allclose(a[k], b, rtol=1e-4, atol=1e-6),
        state_s["params"],
        st["params"],
      )


# ----------------------------------------------------------------------------- the package


def _package_imports(path: pathlib.Path) -> set[str]:
  """Modules of bert_jax.benchmark (and bert_jax's CLI layer) a file imports anywhere in it."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module == "bert_jax.benchmark":
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_jax.benchmark."):
      out.add(node.module.rsplit(".", 1)[1])
    elif isinstance(node, ast.ImportFrom) and node.module == "bert_jax":
      out.update(f"bert_jax.{a.name}" for a in node.names if a.name in ("cli", "main"))
  return out


def test_the_package_imports_form_no_circle_and_load_no_config_by_path():
  graph = {p.stem: _package_imports(p) for p in PACKAGE.glob("*.py")}
  assert graph["finetune_step"] >= {"step"} and "finetune_step" not in graph["step"]
  for name, deps in graph.items():
    if name != "__main__":  # only the CLI entry reaches the CLI layer
      assert not any(d.startswith("bert_jax.") or d == "__main__" for d in deps), (name, deps)
  state: dict[str, int] = {}  # depth-first search: 1 on the stack, 2 done

  def visit(name: str, path: tuple[str, ...]) -> None:
    assert state.get(name) != 1, f"import circle: {' -> '.join(path + (name,))}"
    if state.get(name) == 2:
      return
    state[name] = 1
    for dep in graph.get(name, ()):
      visit(dep, path + (name,))
    state[name] = 2

  for name in graph:
    visit(name, ())
  for p in PACKAGE.glob("*.py"):
    assert "spec_from_file_location" not in p.read_text(), p.name
  assert finetune_step.recipe_module().__name__ == "bert_jax.configs.finetune"


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
  cfg = model_lib.config_for_size("base")
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
  cfg = model_lib.config_for_size("tiny")
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
  vocab = model_lib.config_for_size("tiny").vocab_size
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
