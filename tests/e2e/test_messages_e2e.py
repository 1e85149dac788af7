"""What a user reads when something is off: every JSON file the project reads back fails in one
line naming it; config mistakes are one clean line; `convert` prints its one line; a workdir's
wrong tokenizer is named as such (not blamed on good checkpoints); a tuple of strings takes
`a,b` on the command line; a fine-tuning score says when it is at its majority baseline.

Real files and, where the behaviour is the command line's, real subprocesses."""

import gzip
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCAL = str(ROOT / "configs" / "local.py")
FINETUNE = str(ROOT / "configs" / "finetune.py")


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  env.pop("BERT_JAX_TRACEBACK", None)
  return subprocess.run(
    [sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd
  )


def _jsonl(path, rows):
  with gzip.open(path, "wt") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(path)


def _row(i, label):
  return {"title": f"title {i}", "text": f"the {label} man went home", "label": label}


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
  """A fine-tuning CLI run on a JSONL file with two text fields given as `title,text`, at a
  learning rate of 1e-9: whatever it predicts, dev (all 'pos', the train majority) cannot beat
  the majority class. Returns (workdir, command, result)."""
  d = tmp_path_factory.mktemp("ft")
  train = _jsonl(d / "train.jsonl.gz", [_row(i, "pos" if i % 4 else "neg") for i in range(16)])
  dev = _jsonl(d / "dev.jsonl.gz", [_row(i, "pos") for i in range(8)])
  test = _jsonl(d / "test.jsonl.gz", [_row(i, "neg" if i == 0 else "pos") for i in range(4)])
  wd = d / "run"
  cmd = [
    "-m",
    "bert_jax.finetune",
    f"--config={FINETUNE}:custom,seeds=1,size=tiny",
    f"--workdir={wd}",
    f"--config.task.train={train}",
    f"--config.task.dev={dev}",
    f"--config.task.test={test}",
    "--config.task.text_fields=title,text",
    "--config.data.max_seq_length=16",
    "--config.data.buckets=(16,)",
    "--config.data.batch_size=16",
    "--config.data.eval_batch_size=16",
    "--config.opt.lr=1e-9",  # nothing learned (config_schema refuses an lr of 0)
    "--config.opt.epochs=1",
    "--config.ckpt.async_save=False",
  ]
  return wd, cmd, _run(*cmd)


@pytest.mark.slow
def test_text_fields_comma_form_and_majority_baseline(finetuned):
  wd, _, r = finetuned
  assert r.returncode == 0, r.stderr[-3000:]
  config = json.loads((wd / "config.json").read_text())
  assert config["task"]["text_fields"] == ["title", "text"]
  results = json.loads((wd / "results.json").read_text())
  base = results["baseline"]
  assert {k: base[k] for k in ("name", "prediction", "dev", "test")} == {
    "name": "majority class",
    "prediction": "pos",
    "dev": {"accuracy": 1.0},
    "test": {"accuracy": 0.75},
  }
  assert base["at_or_below"]["dev"] == [0]
  test_acc = results["seeds"][0]["test"]["accuracy"]
  assert base["at_or_below"]["test"] == ([0] if test_acc <= 0.75 else [])
  dev_line = [ln for ln in r.stdout.splitlines() if ln.startswith("custom dev accuracy:")]
  assert len(dev_line) == 1 and re.fullmatch(
    r"custom dev accuracy: [01]\.\d{4} ± 0\.0000 \(median .*, 1 seed\); majority class "
    r"1\.0000: the seed is at or below it",
    dev_line[0],
  ), r.stdout[-2000:]
  test_line = [ln for ln in r.stdout.splitlines() if ln.startswith("custom test accuracy:")]
  assert len(test_line) == 1 and "; majority class 0.7500" in test_line[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_data_dir):
  """A tiny pretraining run on the session's data: 2 steps, checkpoints at 1 and 2."""
  import importlib.util

  from bert_jax import train

  spec = importlib.util.spec_from_file_location("local_config", LOCAL)
  local = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(local)
  c = local.get_config("size=tiny,steps=2")
  c.data.dir, c.data.max_seq_length, c.data.batch_size = tiny_data_dir, 64, 8
  c.masking.max_predictions = 10
  c.model.hidden_size, c.model.intermediate_size, c.model.vocab_size = 32, 64, 30522
  c.objective.nsp = True  # the session's data has NSP pairs
  c.ckpt.every_steps, c.ckpt.async_save = 1, False
  c.eval.every_steps, c.log.fill_mask = 0, ()
  wd = tmp_path_factory.mktemp("pre") / "workdir"
  train.train_and_evaluate(c, str(wd))
  return wd


@pytest.mark.slow
def test_convert_prints_its_line_only(workdir, tmp_path):
  r = _run("-m", "bert_jax.convert", f"--src={workdir}", f"--dst={tmp_path / 'hf'}")
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout == f"convert: wrote hf checkpoint {tmp_path / 'hf'}\n"
  info = re.compile(r"^I\d{4} ", re.M)  # absl's INFO lines (orbax logs every read at INFO)
  assert not info.search(r.stderr), r.stderr[:2000]
  # --verbosity still shows them.
  r = _run("-m", "bert_jax.convert", f"--src={workdir}", f"--dst={tmp_path / 'hf2'}", "-v=0")
  assert r.returncode == 0 and info.search(r.stderr)
