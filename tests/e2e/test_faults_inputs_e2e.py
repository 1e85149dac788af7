"""The end-to-end half of tests/unit/test_faults_inputs.py (real processes; slow): see its
docstring."""

import sys

import jax
import pytest
from unit.test_faults_inputs import (
  _KILLED_CONVERT,
  _create_data,
  _documents,
  _error,
  _params_dir,
  _run,
  _snapshot,
)
from unit.test_train import _main_cmd

import bert_jax
from bert_jax import model as model_lib
from bert_jax.interop import hf_io
from bert_jax.model_config import BertConfig

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


@pytest.mark.parametrize("how", ["swap", "two_renames"])
@pytest.mark.slow
def test_overwrite_export_killed_at_its_swap_keeps_an_output(tmp_path, how):
  """`convert --overwrite` killed at the moment it replaces the old output: the old output was
  only in a hidden .hf.old-PID. Now the swap is one step (the new output whole in place); where
  the file system cannot swap, the next writer puts the old one back before anything else."""
  old_src, new_src = _params_dir(tmp_path / "old", 0), _params_dir(tmp_path / "new", 1)
  hf = tmp_path / "hf"
  cmd = [sys.executable, "-m", "bert_jax.convert", f"--dst={hf}"]
  assert _run([*cmd, f"--src={old_src}"]).returncode == 0
  old = _snapshot(hf)
  r = _run([sys.executable, "-c", _KILLED_CONVERT, how, f"--src={new_src}", f"--dst={hf}",
            "--overwrite"])  # fmt: skip
  assert r.returncode == -9, r.stderr[-2000:]
  hidden = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".hf."))
  after_kill = _snapshot(hf) if hf.exists() else None
  if how == "swap":
    assert hf.is_dir() and _snapshot(hf) != old  # the new output, whole
    assert bert_jax.load(str(hf)).config.hidden_size == 16
    assert len(hidden) == 1 and hidden[0].startswith(".hf.tmp-")  # the old, for the next writer
  else:
    # The old output aside, the new one not yet in place: no output under its name.
    assert not hf.exists() and [h.split("-")[0] for h in hidden] == [".hf.old", ".hf.tmp"]
  # The next writer (here one that is refused: no --overwrite) leaves the last whole output
  # in place and nothing hidden.
  r = _run([*cmd, f"--src={new_src}"])
  assert "already exists" in _error(r, "convert")
  assert _snapshot(hf) == (old if how == "two_renames" else after_kill)
  r = _run([*cmd, f"--src={new_src}", "--overwrite"])
  assert r.returncode == 0, r.stderr[-2000:]
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf.")]
