"""The end-to-end half of tests/unit/test_finetune_faults.py (real processes; slow): see its
docstring."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from unit._finetune_tasks import CLI_FIELDS, REPO, _splits, _write, finetune_config, sentiment
from unit.test_finetune_faults import _cmd, _one_line, _run
from unit.test_train import _env

from bert_jax import finetune
from bert_jax.runtime import checkpoints as ckpt_lib

# What test_finetune's in-process runs use to learn its tasks (CLI_FIELDS: 2 epochs, dropout).
LEARNS = {"opt.epochs": 4, "model.hidden_dropout_prob": 0.0, "model.attention_dropout_prob": 0.0}


def _rows(path, split):
  with open(path) as f:
    return [r for r in map(json.loads, f) if r["split"] == split]


def _dead_pid():
  p = subprocess.Popen([sys.executable, "-c", "pass"])
  p.wait()
  return p.pid


@pytest.mark.slow
def test_unlabelled_test_split_gets_predictions_and_no_metrics(tmp_path):
  """37.1: a test file without labels (as GLUE's): no score of any kind (it used to get a
  "loss" against class 0), each example's prediction at the best dev point in
  seed_0/predictions_test.jsonl; the leftovers of a killed best/ save go with the next save."""
  train, dev, _ = _splits(tmp_path, sentiment)
  hidden = sentiment(np.random.default_rng(1), 40)
  test = _write(tmp_path / "test.jsonl.gz", [{"sentence": r["sentence"]} for r in hidden])
  seed_dir = tmp_path / "run" / "seed_0"
  seed_dir.mkdir(parents=True)
  (seed_dir / f".best.tmp-{_dead_pid()}-k").mkdir()  # a best/ save a SIGKILL cut short
  (seed_dir / ".best.tmp-abcd").mkdir()  # an older version's name (no pid)
  live = seed_dir / f".best.tmp-{os.getpid()}-x"  # a live process's: not a leftover
  live.mkdir()
  fields = {**LEARNS, "task.train": train, "task.dev": dev, "task.test": test}
  r = _run(_cmd(tmp_path / "run", **fields))
  assert r.returncode == 0, r.stderr[-2000:]
  res = json.loads((tmp_path / "run" / "results.json").read_text())
  assert res["splits"] == {"train": "labelled", "dev": "labelled", "test": "unlabelled"}
  assert res["test"] == {} and res["seeds"][0]["test"] == {}
  assert res["dev"]["accuracy"]["mean"] > 0.85
  assert res["baseline"]["test"] == {}
  assert _rows(seed_dir / "metrics.jsonl", "test") == []  # no made-up test row
  preds = [json.loads(ln) for ln in (seed_dir / "predictions_test.jsonl").read_text().splitlines()]
  assert [p["source"] for p in preds] == [f"{test}:{i}" for i in range(1, 41)]
  # The best point's predictions: right where the hidden labels say (chance would be 0.5).
  hits = [p["prediction"] == h["label"] for p, h in zip(preds, hidden, strict=True)]
  assert np.mean(hits) > 0.85, preds
  assert "test: unlabelled, so no metrics" in r.stdout
  assert sorted(n for n in os.listdir(seed_dir) if n.startswith(".best")) == [live.name]


@pytest.mark.slow
def test_no_test_split_reports_dev(tmp_path):
  """38.1: train and dev files, no test file: the run trains, reports dev and says there is no
  test split (it used to fail after training with `summarize_seeds: no seeds`)."""
  train, dev, _ = _splits(tmp_path, sentiment)
  wd = tmp_path / "run"
  r = _run(_cmd(wd, **LEARNS, **{"task.train": train, "task.dev": dev}))
  assert r.returncode == 0, r.stderr[-2000:]
  res = json.loads((wd / "results.json").read_text())
  assert res["splits"]["test"] == "absent" and res["test"] == {}
  assert res["dev"]["accuracy"]["n"] == 1 and res["dev"]["accuracy"]["mean"] > 0.85
  assert "custom test: no test split (config.task.test is empty): dev only" in r.stdout
  assert "custom dev accuracy: " in r.stdout
  assert json.loads((wd / "run_status.json").read_text())["state"] == "finished"


@pytest.mark.slow
def test_sigterm_during_an_eval_stops_it_and_the_rerun_evaluates_again(tmp_path):
  """37.5: SIGTERM once epoch 1 ends, while the dev eval (10,000 rows) runs: the eval stops
  between two batches, nothing of it is written, the step is saved with its eval pending and
  the run exits 75; the rerun evaluates that step first and ends as an uninterrupted run."""
  train, _, test = _splits(tmp_path, sentiment)
  dev = _write(tmp_path / "big_dev.jsonl.gz", sentiment(np.random.default_rng(2), 10_000))
  fields = {"task.train": train, "task.dev": dev, "task.test": test}
  c = finetune_config.get_config("custom,seeds=1,size=tiny")
  for key, value in {**CLI_FIELDS, **fields}.items():
    section, name = key.split(".")
    c[section][name] = value
  full = finetune.finetune(c, str(tmp_path / "full"))
  per_epoch = 192 // 16  # train rows / batch size

  wd = tmp_path / "cut"
  p = subprocess.Popen(
    _cmd(wd, **fields), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
  )
  out = []
  for line in iter(p.stdout.readline, b""):
    out.append(line.decode())
    if f"step {per_epoch}/" in out[-1]:  # its progress line comes right before the eval
      p.send_signal(signal.SIGTERM)
      break
  rest, err = p.communicate(timeout=600)
  out.append(rest.decode())
  assert p.returncode == 75, err[-2000:]
  seed_dir = wd / "seed_0"
  assert f"dev @ {per_epoch}" not in "".join(out)
  assert _rows(seed_dir / "metrics.jsonl", "dev") == []
  assert not (seed_dir / "best").exists()
  meta, step, _ = ckpt_lib.read_meta(str(seed_dir))
  assert step == per_epoch and meta["pending_metrics"]["_eval_pending"] == 1.0

  r = _run(_cmd(wd, **fields))
  assert r.returncode == 0, r.stderr[-2000:]
  cut = json.loads((wd / "results.json").read_text())
  strip = lambda res: [{k: v for k, v in s.items() if k != "train_seconds"} for s in res["seeds"]]
  assert strip(cut) == strip(full)
  for split in ("dev", "test"):
    assert _rows(seed_dir / "metrics.jsonl", split) == _rows(
      tmp_path / "full" / "seed_0" / "metrics.jsonl", split
    )


@pytest.mark.slow
def test_seeds_are_numbered_from_0_everywhere_and_run_status_counts_seeds(tmp_path):
  """46, first hour 4 and 6: the progress line named seed_0/ 'seed 1/2' and run_status.json
  said "step"/"total_steps" for finished seeds of seeds. Seeds are numbered from 0 in every
  message as in the directories and results.json; the record counts seeds_done of seeds."""
  train, dev, test = _splits(tmp_path, sentiment)
  fields = {"task.train": train, "task.dev": dev, "task.test": test}
  wd = tmp_path / "run"
  cmd = _cmd(wd, "custom,seeds=2,size=tiny", **fields)
  p = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  out = []
  for line in iter(p.stdout.readline, b""):
    out.append(line.decode())
    if "seed 1 [0-1] | step 3/" in out[-1]:
      p.send_signal(signal.SIGTERM)
      break
  rest, err = p.communicate(timeout=600)
  out.append(rest.decode())
  assert p.returncode == 75, err[-2000:]
  assert "Preempted in seed 1: rerun the same command to resume" in "".join(out)
  status = json.loads((wd / "run_status.json").read_text())
  assert status == {"state": "preempted", "seeds_done": 1, "seeds": 2}
  r = _run(cmd)
  assert r.returncode == 0, r.stderr[-2000:]
  lines = "".join(out).splitlines() + r.stdout.splitlines()
  progress = [ln for ln in lines if " | step " in ln]
  labels = {ln.split(" | ")[0].split("] ", 1)[-1] for ln in progress}
  assert labels == {"seed 0 [0-1]", "seed 1 [0-1]"}, progress[:3]
  assert re.search(r"^seed 1: resumed at step \d+$", r.stdout, re.M), r.stdout[-2000:]
  assert sorted(p.name for p in wd.glob("seed_*")) == ["seed_0", "seed_1"]
  assert [s["seed"] for s in json.loads((wd / "results.json").read_text())["seeds"]] == [0, 1]
  status = json.loads((wd / "run_status.json").read_text())
  assert status == {"state": "finished", "seeds_done": 2, "seeds": 2}


@pytest.mark.slow
def test_json_boolean_and_0_1_labels_are_two_classes(tmp_path):
  """46, fault 8: labels given as JSON booleans in some rows and as 0/1 in others became 4
  classes (["0", "1", "False", "True"], accuracy 0.25); true is the class 1, false 0."""
  rng = np.random.default_rng(0)

  def rows(n):
    out = []
    for i, r in enumerate(sentiment(rng, n)):
      positive = r["label"] == "pos"
      out.append({"sentence": r["sentence"], "label": positive if i % 2 else int(positive)})
    return out

  paths = [_write(tmp_path / f"{s}.jsonl.gz", rows(n)) for s, n in (("train", 192), ("dev", 64))]
  wd = tmp_path / "run"
  r = _run(_cmd(wd, **LEARNS, **{"task.train": paths[0], "task.dev": paths[1]}))
  assert r.returncode == 0, r.stderr[-2000:]
  res = json.loads((wd / "results.json").read_text())
  assert res["labels"] == ["0", "1"]
  assert res["dev"]["accuracy"]["mean"] > 0.85
  assert json.loads((wd / "seed_0" / "best" / "task.json").read_text())["labels"] == ["0", "1"]


def _snapshot(root):
  return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_resume_on_changed_inputs_is_refused_naming_them(tmp_path, tiny_data_dir):
  """46, fault 4: after seed 0, with the dev file edited in place and the init run trained
  further, the rerun resumed without a word and averaged seed 0 on the old dev with seed 1
  on the new one. The task files (by content) and the init checkpoint (its step and weights)
  are recorded (inputs.json, results.json); a change refuses the resume in one line naming it,
  with nothing written; the same content under another path resumes."""
  from unit.test_train import _main_cmd

  init = tmp_path / "pretrained"
  for steps in (2, 4):  # trained, then trained further
    cmd = _main_cmd(init, tiny_data_dir, steps, ["--config.ckpt.keep=3"])
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    if steps == 2:
      train, dev, test = _splits(tmp_path, sentiment, (64, 32, 32))
      wd = tmp_path / "run"
      fields = {"task.train": train, "task.dev": dev, "task.test": test, "init": init}
      r = _run(_cmd(wd, "custom,seeds=2,size=tiny", **fields))
      assert r.returncode == 0, r.stderr[-2000:]
      first = json.loads((wd / "results.json").read_text())
      # As a preemption after seed 0 leaves it.
      shutil.rmtree(wd / "seed_1")
      for name in ("results.json", "run_status.json"):
        (wd / name).unlink()
  recorded = json.loads((wd / "inputs.json").read_text())
  assert first["inputs"] == recorded and recorded["init"]["step"] == 2
  assert recorded["init"]["format"] == "workdir" and recorded["init"]["path"] == str(init)
  assert recorded["task"]["dev"]["files"] == [dev]

  # The init run trained further (step 4): refused, naming the steps and the one it began at.
  before = _snapshot(wd)
  line = _one_line(_run(_cmd(wd, "custom,seeds=2,size=tiny", **fields)))
  sha = recorded["init"]["params_sha256"][:12]
  assert re.fullmatch(
    rf"finetune: error: {wd} holds a run on other inputs, and its seeds would mix both: "
    rf"config.init {init} \(step 2 -> 4, weights sha256 {sha} -> [0-9a-f]{{12}}\) \(then -> "
    rf"now\); restore them \(--config.init={init}/checkpoints/2 if that step is kept\), or start "
    rf"afresh with another --workdir \(or after removing {wd}\)",
    line,
  ), line
  assert _snapshot(wd) == before

  # The dev file edited in place as well: both named.
  old_dev = open(dev, "rb").read()
  _write(dev, sentiment(np.random.default_rng(5), 20))
  line = _one_line(_run(_cmd(wd, "custom,seeds=2,size=tiny", **fields)))
  dev_sha = recorded["task"]["dev"]["sha256"][:12]
  assert f": task.dev {dev} (sha256 {dev_sha} -> " in line and "config.init " in line, line
  assert _snapshot(wd) == before

  # The old dev back, and the step the run began at under its own path: the same inputs by
  # content, so the run resumes seed 1 and ends as it first did.
  open(dev, "wb").write(old_dev)
  step2 = {**fields, "init": init / "checkpoints" / "2"}
  r = _run(_cmd(wd, "custom,seeds=2,size=tiny", **step2))
  assert r.returncode == 0, r.stderr[-2000:]
  res = json.loads((wd / "results.json").read_text())
  assert res["inputs"]["init"]["step"] == 2 and res["inputs"]["task"] == recorded["task"]
  assert res["inputs"]["init"]["params_sha256"] == recorded["init"]["params_sha256"]
  assert res["data"]["dev"] == 32
  strip = lambda r: [{k: v for k, v in s.items() if k != "train_seconds"} for s in r["seeds"]]
  assert strip(res) == strip(first)


def _params_dir(path):
  """A randomly initialised tiny BERT (2 layers, hidden 128) as a params dir with BERT's vocab."""
  import jax
  import jax.numpy as jnp

  from bert_jax import model_config, params_tree
  from bert_jax.interop import hf_io
  from bert_jax.tasks import Task
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  cfg = model_config.config_for_size("tiny", vocab_size=30522, max_position_embeddings=64)
  model = Task("t", "classification", ("a", "b"), ("accuracy",)).model(cfg)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = model.init({"params": jax.random.key(0)}, ids, ids, jnp.ones_like(ids))["params"]
  tok = tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())
  hf_io.save_params_dir(path, cfg, params_tree.unbox_to_numpy(params)["bert"], tokenizer=tok)
  return path


@pytest.mark.slow
def test_a_size_override_that_contradicts_the_init_checkpoint(tmp_path):
  """46, "Also": with an init checkpoint, --config.model.num_layers=4 was ignored while
  config.json recorded it. A flag that contradicts the checkpoint is one line (exit 2, nothing
  written); one that agrees runs; config.json records the model that ran."""
  init = _params_dir(tmp_path / "init")
  train, dev, _ = _splits(tmp_path, sentiment, (64, 32, 32))
  fields = {"task.train": train, "task.dev": dev, "init": init}
  wd = tmp_path / "run"
  r = _run(_cmd(wd, **fields, **{"model.num_layers": 4, "model.hidden_dropout_prob": 0.0}))
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.startswith("finetune: ")]
  assert lines == [
    f"finetune: error: --config.model.num_layers=4: config.init={init} is a model with "
    "num_layers=2, and fine-tuning runs the checkpoint's architecture: drop the flag (on top of "
    "a checkpoint only model.hidden_dropout_prob, model.attention_dropout_prob, model.dtype, "
    "model.param_dtype, model.kernels, model.dropout_rng, model.attention_impl, "
    "model.scan_layers, model.remat_policy apply)"
  ], r.stderr[-2000:]
  assert not wd.exists()
  # The preset's own size (base: 12 layers, hidden 768) is no flag: the checkpoint's runs, and
  # config.json says so; a flag equal to the checkpoint's value is no contradiction.
  r = _run(_cmd(wd, "custom,seeds=1", **fields, **{"model.num_layers": 2}))
  assert r.returncode == 0, r.stderr[-2000:]
  model = json.loads((wd / "config.json").read_text())["model"]
  assert (model["num_layers"], model["hidden_size"], model["num_heads"]) == (2, 128, 2)
  results = json.loads((wd / "results.json").read_text())
  assert results["config"]["model"] == model
  assert json.loads((wd / "seed_0" / "best" / "bert_config.json").read_text())["num_layers"] == 2


@pytest.mark.slow
def test_a_small_set_trains_min_steps_and_a_run_that_learned_nothing_says_so(tmp_path):
  """46, first hour 1: 60 rows at the defaults (batch 32, 3 epochs) were 6 steps and learned
  nothing, without a word. Epochs are raised to reach opt.min_steps (100: 50 epochs, dev
  every 17), said in the log and recorded; when every seed is at or below the baseline on dev
  (here lr 1e-9 and a one-class dev, whose majority class scores 1.0) a warning names the fix."""
  rng = np.random.default_rng(0)
  rows = sentiment(rng, 60)
  majority = max(("pos", "neg"), key=[r["label"] for r in rows].count)
  train = _write(tmp_path / "train.jsonl.gz", rows)
  dev = _write(tmp_path / "dev.jsonl.gz", [{**r, "label": majority} for r in sentiment(rng, 16)])
  wd = tmp_path / "run"
  defaults = {"data.batch_size": 32, "opt.epochs": 3, "opt.min_steps": 100, "opt.lr": 1e-9}
  r = _run(
    _cmd(wd, "custom,seeds=1,size=tiny", **{**defaults, "task.train": train, "task.dev": dev})
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert (
    "60 training rows at batch 32 are 2 steps an epoch: 3 epochs would be 6 steps, fewer than "
    "opt.min_steps=100, so each seed trains 50 epochs (100 steps), dev every 34 steps "
    "(--config.opt.min_steps=0 keeps opt.epochs)"
  ) in r.stdout
  res = json.loads((wd / "results.json").read_text())
  assert {k: res["recipe"][k] for k in ("epochs", "epochs_run", "steps")} == {
    "epochs": 3,
    "epochs_run": 50,
    "steps": 100,
  }
  assert [row["step"] for row in _rows(wd / "seed_0" / "metrics.jsonl", "dev")] == [34, 68, 100]
  warning = (
    "the seed scored dev accuracy at or below the majority class (1.0000): nothing "
    "measurable was learned in 100 steps; try a larger --config.opt.lr (now 1e-09), a smaller "
    "--config.data.batch_size (now 32) or more steps (--config.opt.epochs, now 3, or "
    "--config.opt.min_steps, now 100)"
  )
  assert res["warnings"] == [warning]
  assert f"warning: {warning}" in r.stdout.splitlines()
