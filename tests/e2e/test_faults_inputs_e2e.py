"""The end-to-end half of tests/unit/test_faults_inputs.py (real processes; slow): see its
docstring."""

import jax
import pytest
from unit.test_faults_inputs import _create_data, _documents, _error, _run, _snapshot
from unit.test_train import _main_cmd

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
