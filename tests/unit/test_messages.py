"""What a user reads when something is off: every JSON file the project reads back fails in one
line naming it; config mistakes are one clean line; `convert` prints its one line; a workdir's
wrong tokenizer is named as such (not blamed on good checkpoints); a tuple of strings takes
`a,b` on the command line; a fine-tuning score says when it is at its majority baseline.

Real files and, where the behaviour is the command line's, real subprocesses."""

import gzip
import json
import os
import pathlib
import subprocess
import sys
from unittest import mock

import pytest
from absl import flags
from ml_collections.config_flags import config_flags

from bert_jax import cli
from bert_jax.interop import hf_io
from bert_jax.runtime import files

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCAL = str(ROOT / "configs" / "local.py")
FINETUNE = str(ROOT / "configs" / "finetune.py")


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  env.pop("BERT_JAX_TRACEBACK", None)
  return subprocess.run(
    [sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd
  )


def _lines(text: str, prog: str) -> list[str]:
  """The lines a command wrote under its own name (other processes' warnings aside)."""
  return [ln for ln in text.splitlines() if ln.startswith(f"{prog}:")]


# ----------------------------------------------------------------------------- config messages


@pytest.mark.parametrize(
  "prog, args, message",
  [
    ("main", [f"--config={LOCAL}", "--config.opt.lrr=1"],
     "unknown config key opt.lrr (did you mean opt.lr?)"),
    ("main", [f"--config={LOCAL}", "--config.nosection.x=1"], "unknown config key nosection.x"),
    ("main", [f"--config={LOCAL}", "--noconfig.objective.nspp"],
     "unknown config key objective.nspp (did you mean objective.nsp?)"),
    ("main", [f"--config={LOCAL}", "--config.opt.lr.x=1"],
     "config key opt.lr.x: opt.lr is a float, not a section"),
    ("main", ["--config=configs/nope.py"], "config file configs/nope.py not found"),
    ("main", ["--config=configs/nope.py", "--config.opt.lr=1"],
     "config file configs/nope.py not found"),
    ("main", ["--config=local:foo=1"],
     "--config=local:foo=1: unknown config argument 'foo'; known: size, steps"),
    ("finetune", [f"--config={FINETUNE}:custom", "--config.task.text_field=a"],
     "unknown config key task.text_field (did you mean task.text_fields?)"),
  ],
)  # fmt: skip
def test_config_mistakes_are_one_clean_line(tmp_path, prog, args, message):
  r = _run("-m", f"bert_jax.{prog}", f"--workdir={tmp_path / 'wd'}", *args, cwd=ROOT)
  assert r.returncode == 2, r.stderr[-2000:]
  assert _lines(r.stderr, prog) == [f"{prog}: error: {message}"], r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert not (tmp_path / "wd").exists()


def _parse(*args: str):
  """A config flag parsed as the commands parse it (cli's tuple parser is registered)."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=fv, lock_config=True)
  argv = ["prog", f"--config={FINETUNE}:custom", *args]
  with mock.patch.object(sys, "argv", argv):  # config_flags reads --config.a.b from sys.argv
    fv(argv)
  return fv.config


def test_tuple_of_strings_takes_commas():
  assert cli.CommaTupleParser is not None
  c = _parse("--config.task.text_fields=title,text", "--config.task.labels=neg, pos")
  assert (c.task.text_fields, c.task.labels) == (("title", "text"), ("neg", "pos"))
  # The literal and the repeated forms are as before; a literal may hold commas in an element.
  c = _parse("--config.task.text_fields=('title','text')", "--config.task.labels=('a,b','c')")
  assert (c.task.text_fields, c.task.labels) == (("title", "text"), ("a,b", "c"))
  c = _parse("--config.task.text_fields=title", "--config.task.text_fields=text")
  assert c.task.text_fields == ("title", "text")
  assert _parse("--config.task.text_fields=title").task.text_fields == ("title",)
  # Numbers stay numbers.
  c = _parse("--config.mesh.shape=2,-1,1", "--config.grid.lr=1e-5,2e-5")
  assert (c.mesh.shape, c.grid.lr) == ((2, -1, 1), (1e-5, 2e-5))


# ----------------------------------------------------------------------------- JSON read back


def test_read_json_names_the_file(tmp_path):
  p = tmp_path / "x.json"
  for text, message in [
    ("", "empty file, not JSON"),
    ('{"a": 1', "not valid JSON (Expecting ',' delimiter at line 1)"),
    ("[]", "holds a JSON array, not an object"),
    ("3", "holds a JSON number, not an object"),
    ('{"dev": {}}', "no test (not the file this run wrote)"),
  ]:
    p.write_text(text)
    with pytest.raises(ValueError) as e:
      files.read_json(p, keys=("dev", "test"))
    assert str(e.value) == f"{p}: {message}"
  p.write_bytes(b"\xff\xfe")
  with pytest.raises(ValueError, match=f"^{p}: not a JSON file"):
    files.read_json(p)
  with pytest.raises(FileNotFoundError, match=f"^{tmp_path}/nope.json: no such file$"):
    files.read_json(tmp_path / "nope.json")
  p.write_text('{"dev": 1, "test": 2}')
  assert files.read_json(p, keys=("dev", "test")) == {"dev": 1, "test": 2}


def test_task_json_of_a_head_dir_names_the_file(tmp_path):
  from bert_jax.tasks import features

  d = tmp_path / "best"
  d.mkdir()
  (d / features.HEAD_FILE).write_bytes(b"")
  (d / hf_io.TASK_FILE).write_text("")
  with pytest.raises(ValueError, match=f"^{d / hf_io.TASK_FILE}: empty file, not JSON$"):
    features.load_head(str(d))
  (d / hf_io.TASK_FILE).write_text("[]")
  message = f"^{d / hf_io.TASK_FILE}: holds a JSON array, not an object$"
  with pytest.raises(ValueError, match=message):
    hf_io.read_task(d)


def test_report_names_a_foreign_json(tmp_path):
  run = tmp_path / "root" / "run"
  run.mkdir(parents=True)
  (run / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 1.0}\n')
  (run / "config.json").write_text("[]")
  r = _run("-m", "bert_jax.report", f"--root={tmp_path / 'root'}")
  assert r.returncode == 1
  assert _lines(r.stderr, "report") == [
    f"report: error: {run / 'config.json'}: holds a JSON array, not an object"
  ]
  (run / "config.json").unlink()
  (run / "metrics.jsonl").unlink()
  (run / "results.json").write_text("[]")
  r = _run("-m", "bert_jax.report", f"--root={tmp_path / 'root'}")
  assert r.returncode == 1
  assert _lines(r.stderr, "report") == [
    f"report: error: {run / 'results.json'}: not a fine-tuning results.json (no task or "
    "main_metric)"
  ]


# ----------------------------------------------------------------------------- fine-tuning


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


# ----------------------------------------------------------------------------- pretraining runs


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
