"""Fault suite, inputs a run cannot use (issue 46): a corpus too small for an eval split, a file
with CR-only line ends, a metrics.jsonl that is not a regular file or a tb that is one, no home
directory, `ulimit -v`, a refused init_from, an --overwrite export killed at its swap, and the
notebook API's edge arguments. Real `python -m` processes on real files; each asserts what is on
disk afterwards: one line, nothing made that the run would not keep, nothing lost."""

import pathlib
import re
import subprocess
import sys

import jax
import pytest
from unit.test_train import _env, _main_cmd

from bert_jax import config_lib
from bert_jax import model as model_lib
from bert_jax.interop import hf_io
from bert_jax.model_config import BertConfig

CORPUS = config_lib.BUNDLED_CORPUS


def _run(cmd, **kw):
  kw.setdefault("env", _env())
  kw.setdefault("timeout", 600)
  return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _error(r, prog="main", status=1):
  """The one `PROG: error: ...` line that ends a failed command (absl log lines aside)."""
  assert r.returncode == status, r.stderr[-3000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not re.match(r"[IWEF]\d{4} ", ln)]
  assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), r.stderr[-3000:]
  return lines[0].removeprefix(f"{prog}: error: ")


def _documents(n):
  """The first n documents of the bundled corpus, as its text."""
  docs = [d for d in pathlib.Path(CORPUS).read_text().split("\n\n") if d.strip()]
  return "\n\n".join(docs[:n]) + "\n"


def _create_data(inp, out, *extra):
  return _run([sys.executable, "-m", "bert_jax.create_data", f"--input={inp}",
               f"--output_dir={out}", "--noprogress", "--num_workers=1", *extra])  # fmt: skip


def _snapshot(d):
  return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- fault 3


@pytest.mark.slow
def test_trainer_refuses_data_without_an_eval_split_before_training(tmp_path):
  """A create_data output without eval sequences (--eval_fraction=0, one document) used to
  train and then die at the first eval with a TypeError (and again on every rerun): now one
  line before the workdir exists. So do first-use builds of one document or one sentence."""
  (tmp_path / "one_doc.txt").write_text(_documents(1))
  (tmp_path / "one_sentence.txt").write_text(_documents(1).splitlines()[0] + "\n")
  data = tmp_path / "data"
  assert _create_data(tmp_path / "one_doc.txt", data, "--eval_fraction=0").returncode == 0
  before = _snapshot(data)
  wd = tmp_path / "wd"
  line = _error(_run(_main_cmd(wd, data, 4, ["--config.data.max_seq_length=128"])))
  assert line == (
    f"{data} has no eval sequences (built with eval_fraction=0.0): every run evaluates on its "
    "eval split; rebuild it with python -m bert_jax.create_data --eval_fraction > 0 from at "
    "least 2 documents"
  )
  assert not wd.exists() and _snapshot(data) == before
  for name in ("one_doc.txt", "one_sentence.txt"):
    data_input = [f"--config.data.input={tmp_path / name}", "--config.data.train_vocab_size=0"]
    cmd = _main_cmd(wd, "", 4, data_input)  # BERT's vocab, as _main_cmd's model
    cmd.remove("--config.data.dir=")
    line = _error(_run(cmd))
    assert line.startswith(
      f"config.data.input={tmp_path / name}: no document of it is held out for the eval split"
    ), line
    assert not wd.exists()  # made for the build, removed with nothing of a run in it


@pytest.mark.slow
def test_refused_init_from_leaves_no_checkpoints_dir(tiny_data_dir, tmp_path):
  """init_from of another architecture is refused before the checkpoint manager makes
  checkpoints/: an existing workdir keeps only what it had, a new one is not left behind."""
  cfg = BertConfig(vocab_size=30522, hidden_size=32, num_layers=3, num_heads=2,
                             intermediate_size=64, max_position_embeddings=512)  # fmt: skip
  model = model_lib.BertForPreTraining(cfg)
  hf_io.save_params_dir(tmp_path / "src", cfg, model_lib.init_params(model, jax.random.key(0)))
  extra = [f"--config.init_from={tmp_path / 'src'}"]
  existing = tmp_path / "existing"
  existing.mkdir()
  (existing / "notes.txt").write_text("mine")
  for wd in (existing, tmp_path / "new"):
    line = _error(_run(_main_cmd(wd, tiny_data_dir, 2, extra)))
    assert "another architecture" in line and "num_layers" in line, line
  assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
  assert not (tmp_path / "new").exists()
