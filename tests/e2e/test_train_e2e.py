"""The end-to-end half of tests/unit/test_train.py (real processes; slow): see its
docstring."""

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from unit.test_train import (
  ROOT,
  TINY,
  _env,
  _main_cmd,
  _params,
  _rows,
  _run_two_processes,
  _synthetic_batch,
  tiny_config,
)

from bert_jax import config_schema, masking, model_config, objectives, optim, train
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax.data import input_pipeline
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.tokenizers import tokenizer as tokenizer_lib

# ----------------------------------------------------------------------------- in-process


@pytest.mark.slow
def test_grad_accumulation_is_exact(tiny_data_dir):
  """4 micro-batches give the big-batch update (losses normalised by the whole batch)."""
  c = tiny_config(tiny_data_dir)
  cfg = model_config.BertConfig(
    **{**train.bert_config(c).__dict__, "hidden_dropout_prob": 0.0, "attention_dropout_prob": 0.0}
  )
  model = model_lib.BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)
  obj = objectives.Objective.from_config(c)
  tok = tokenizer_lib.load_tokenizer(os.path.join(tiny_data_dir, "tokenizer"))
  tables = masking.tables_from_tokenizer(tok)
  mesh = sh.make_mesh((1, -1, 1))
  batch = _synthetic_batch(b=8, length=64)
  results = []
  for accum in (1, 4):
    state, state_sh, _ = train.create_state(c, model, tx, mesh, sh.DEFAULT_RULES, jax.random.key(0))
    with sh.mesh_context(mesh, sh.DEFAULT_RULES):
      step = jax.jit(train.make_train_step(model, tx, obj, tables, accum), donate_argnums=0)
      b = jax.device_put(batch, sh.batch_sharding(mesh))
      for _ in range(2):
        state, m = step(state, b, jax.random.key(1))
    results.append((float(m["loss"]), jax.tree.map(np.asarray, state["params"])))
  (l1, p1), (l4, p4) = results
  assert abs(l1 - l4) < 1e-5
  assert max(jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), p1, p4))) < 1e-6


@pytest.mark.slow
def test_train_restores_onto_another_mesh(tiny_data_dir, tmp_path):
  """Saved on (8,1,1), restored bit-exactly onto (2,2,2) (params and Adam moments, truly
  resharded), and training continues with the losses of an uninterrupted (8,1,1) run.

  (Params after further Adam steps are not compared tightly: Adam turns fp32 reduction-order
  noise in near-zero gradients into lr-sized differences.)"""
  wd = str(tmp_path / "switch")
  c1 = tiny_config(tiny_data_dir, **{"mesh.shape": (8, 1, 1), "opt.total_steps": 3})
  assert train.train_and_evaluate(c1, wd)["step"] == 3

  c2 = tiny_config(tiny_data_dir, **{"mesh.shape": (2, 2, 2)})
  model = model_lib.BertForPreTraining(train.bert_config(c2))
  tx = optim.make_optimizer(c2.opt)
  restored = {}
  for shape in ((8, 1, 1), (2, 2, 2)):
    mesh = sh.make_mesh(shape)
    _, _, abstract = train.create_state(c2, model, tx, mesh, sh.DEFAULT_RULES, jax.random.key(0))
    state, _ = ckpt_lib.Checkpointer(os.path.join(wd, "checkpoints")).restore(3, abstract)
    restored[shape] = state
  q = restored[(2, 2, 2)]["params"]["bert"]["encoder"]["layer_0"]["query"]["kernel"]
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert q.addressable_shards[0].data.shape == (16, 1, 16)
  for a, b in zip(
    jax.tree.leaves(restored[(8, 1, 1)]), jax.tree.leaves(restored[(2, 2, 2)]), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  ref = str(tmp_path / "ref")
  shutil.copytree(wd, ref)  # the same first 3 steps, to resume on (8,1,1)
  out2 = train.train_and_evaluate(c2, wd)
  assert out2["step"] == 6
  # Reference: the same 3 + 3 steps (the schedule follows total_steps) all on (8,1,1).
  train.train_and_evaluate(tiny_config(tiny_data_dir, **{"mesh.shape": (8, 1, 1)}), ref)
  assert [r["step"] for r in _rows(wd)] == list(range(1, 7))
  np.testing.assert_allclose(
    [r["mlm_loss"] for r in _rows(wd)], [r["mlm_loss"] for r in _rows(ref)], rtol=1e-4
  )
  np.testing.assert_allclose(
    [r["nsp_loss"] for r in _rows(wd)], [r["nsp_loss"] for r in _rows(ref)], rtol=1e-4
  )


@pytest.mark.slow
def test_init_from_other_architecture_fails(tiny_data_dir, tmp_path):
  src = str(tmp_path / "src")
  train.train_and_evaluate(
    tiny_config(tiny_data_dir, **{"opt.total_steps": 1, "opt.warmup_steps": 0}), src
  )
  c = tiny_config(tiny_data_dir, **{"model.num_layers": 3, "init_from": src})
  with pytest.raises(ValueError, match=r"another architecture: num_layers=2 \(checkpoint\) vs 3"):
    train.train_and_evaluate(c, str(tmp_path / "dst"))
  # Same architecture: weights come over, the step restarts at 0.
  c = tiny_config(tiny_data_dir, **{"init_from": src, "opt.total_steps": 1, "opt.warmup_steps": 0})
  train.train_and_evaluate(c, str(tmp_path / "ok"))
  assert _params(str(tmp_path / "ok"))[0] == 1


# ----------------------------------------------------------------------------- subprocess


@pytest.mark.slow
def test_sigkill_resume_is_bit_exact(tiny_data_dir, tmp_path):
  """Kill -9 mid-run, rerun the same command: params bit-identical to an uninterrupted run,
  metrics history identical after the restart point."""
  steps = 16
  ref = tmp_path / "ref"
  subprocess.run(_main_cmd(ref, tiny_data_dir, steps), env=_env(), check=True, capture_output=True)

  wd = tmp_path / "killed"
  proc = subprocess.Popen(
    _main_cmd(wd, tiny_data_dir, steps),
    env=_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  deadline = time.time() + 240
  metrics = wd / "metrics.jsonl"
  while time.time() < deadline and proc.poll() is None:
    # orbax renames a save to its step number only once it is committed
    committed = (wd / "checkpoints" / "4").is_dir()
    if committed and metrics.exists() and any(r["step"] >= 6 for r in _rows(wd)):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "run finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = max(r["step"] for r in _rows(wd))
  assert 6 <= killed_at < steps
  resume_step = ckpt_lib.read_meta(str(wd))[1]  # the last committed checkpoint
  assert resume_step in (4, 8, 12) and resume_step < killed_at

  r = subprocess.run(
    _main_cmd(wd, tiny_data_dir, steps), env=_env(), capture_output=True, text=True
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"at step {resume_step}" in r.stdout

  step_a, pa = _params(wd)
  step_b, pb = _params(ref)
  assert step_a == step_b == steps
  for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
    np.testing.assert_array_equal(a, b)
  assert _rows(wd) == _rows(ref)
  assert _rows(wd, "eval") == _rows(ref, "eval")


@pytest.mark.slow
def test_two_processes_match_one(tiny_data_dir, tmp_path):
  """jax.distributed over localhost, 2 processes x 4 CPU devices == 1 process x 8 devices."""
  steps = 4
  one = tmp_path / "one"
  subprocess.run(
    _main_cmd(one, tiny_data_dir, steps, ["--num_cpu_devices=8", "--config.mesh.shape=(2,4,1)"]),
    env=_env(),
    check=True,
    capture_output=True,
  )
  two = tmp_path / "two"
  for code, _, err in _run_two_processes(
    two, tiny_data_dir, steps, ["--config.mesh.shape=(2,4,1)"]
  ):
    assert code == 0, err[-3000:]
  a, b = _rows(one), _rows(two)
  assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
  np.testing.assert_allclose([r["mlm_loss"] for r in b], [r["mlm_loss"] for r in a], rtol=2e-5)
  np.testing.assert_allclose([r["nsp_loss"] for r in b], [r["nsp_loss"] for r in a], rtol=2e-5)


@pytest.mark.slow
def test_load_in_fresh_single_device_process(tiny_data_dir, tmp_path):
  """A checkpoint written on a (2,2,2) mesh loads in a plain 1-device process (a notebook)."""
  wd = str(tmp_path / "mesh222")
  train.train_and_evaluate(
    tiny_config(tiny_data_dir, **{"mesh.shape": (2, 2, 2), "opt.total_steps": 2}), wd
  )
  code = (
    "import jax, bert_jax; assert jax.device_count() == 1; m = bert_jax.load(WD); "
    "r = m.fill_mask('the queen said [MASK] to alice .'); "
    "e = m.embed(['a sentence'], layers=(-1, -2)); "
    "print(m.step, len(r), len(r[0]), r[0][0][0], e.hidden[0].shape, e.tokens[0])"
  ).replace("WD", repr(wd))
  r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  step, n_masks, top_k, token, *rest = r.stdout.split(maxsplit=4)
  assert (step, n_masks, top_k) == ("2", "1", "5")
  assert token and not token.startswith("[")  # a real word piece
  assert "(2, 4, 32)" in r.stdout and "'[CLS]', 'a', 'sentence', '[SEP]'" in r.stdout


@pytest.mark.slow
def test_bundled_default_trains_its_vocab_and_builds_data(tmp_path):
  """configs/local.py's first-use path: a WordPiece vocab trained on the bundled corpus,
  data built with it, then training; a vocab size the model does not have fails first."""
  spec = importlib.util.spec_from_file_location("local_config", ROOT / "configs" / "local.py")
  local = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(local)
  c = local.get_config("steps=2")
  c.model.update(TINY)
  c.model.vocab_size = c.data.train_vocab_size = 1000
  c.ckpt.async_save = False
  c.eval.max_batches = 1
  c.log.fill_mask = ()
  out = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert out["step"] == 2 and out["train"]["mlm_loss"] > 0
  assert 0 <= out["eval"]["mlm_accuracy_at_mask"] <= 1 and 0 <= out["eval"]["mlm_accuracy"] <= 1
  with open(tmp_path / "wd" / "vocab.txt") as f:
    assert len(f.read().splitlines()) == 1000
  meta = input_pipeline.read_metadata(str(tmp_path / "wd" / "data"))
  assert meta["tokenizer"]["vocab_size"] == 1000 and meta["max_seq_length"] == 64

  c.data.train_vocab_size = 900
  with pytest.raises(
    config_schema.ConfigError, match="train_vocab_size=900: must equal config.model.vocab_size=1000"
  ):
    train.train_and_evaluate(c, str(tmp_path / "wd2"))
  assert not (tmp_path / "wd2").exists()


@pytest.mark.slow
def test_a_run_that_never_leaves_its_majority_baseline_says_so(tiny_data_dir, tmp_path, capsys):
  """Two steps of a random model: held-out accuracy is at most the majority baseline, and both
  the eval line and the run's closing line say so (a run that 'finished' without learning)."""
  c = tiny_config(tiny_data_dir, **{"opt.total_steps": 2, "eval.every_steps": 2})
  out = train.train_and_evaluate(c, str(tmp_path / "wd"))
  assert out["eval"]["mlm_accuracy"] <= out["eval"]["mlm_majority_baseline"]
  printed = capsys.readouterr().out
  assert "is not above the majority baseline" in printed
  assert "Finished, but held-out mlm_accuracy ended at or below its majority baseline" in printed
