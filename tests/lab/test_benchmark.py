"""bert_jax.benchmark: our step is the trainer's, a tiny run emits well-formed JSON, the
summaries pick the right ratios, the lockstep choreography, the peer side's isolation from
bert_jax, and the huge-page malloc tunable."""

import ast
import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import backends, model_config, train
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax.benchmark import (
  batches,
  data,
  finetune_step,
  host,
  lockstep,
  measure,
  memory,
  peer_worker,
  peers,
  sizes,
  step,
  suite,
  tables,
)

PACKAGE = pathlib.Path(step.__file__).parent


# ----------------------------------------------------------------------------- step + suite


@pytest.mark.slow
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
  assert s.cfg == backends.resolve_kernels(train.bert_config(config), "cpu")
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
    assert backends.resolve_kernels(train.bert_config(config), "tpu").kernels == kernels


@pytest.mark.slow
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
  cfg = model_config.config_for_size("tiny")
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
  n_params = model_lib.count_params(model_lib.abstract_params(model_config.config_for_size("tiny")))
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
  for name in ("host.py", "protocol.py", "kernel_families.py"):
    always, _ = _module_imports(PACKAGE / name)
    assert always <= stdlib, (name, always - stdlib)
  always, _ = _module_imports(PACKAGE / "batches.py")
  assert always - stdlib == {"numpy"}
  always, in_package = _module_imports(PACKAGE / "peer_worker.py")
  assert always - stdlib == {"numpy", "host", "protocol", "batches", "kernel_families"}
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
  cfg = model_config.config_for_size("tiny")
  assert abs(rec["losses"][0] - (math.log(cfg.vocab_size) + math.log(2))) < 0.5
  # The peers' FLOPs count the MLM head at every position.
  assert rec["flops_per_token"] == model_lib.train_flops_per_token(cfg, 32, 32)


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
  assert sizes.config_for_size("base") == model_config.config_for_size("base")
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_vmap_seeds_probe_steps_each_seed_as_its_own_step():
  """tools/probes/vmap_seeds_probe.py: seed k of the vmapped step gets seed k's single step."""
  spec = importlib.util.spec_from_file_location(
    "vmap_seeds_probe",
    pathlib.Path(__file__).resolve().parents[2] / "tools" / "probes" / "vmap_seeds_probe.py",
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
