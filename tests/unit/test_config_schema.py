"""bert_jax.config_schema: every field of the trainer's, fine-tuning's and create_data's configs
checked in one place; a bad value is one line naming the field, the value and what is allowed,
exit status 2, before a directory or a file exists. Real `python -m` processes for the command
lines (the issue's probe values); the rules themselves in-process."""

import os
import pathlib
import subprocess
import sys

import pytest

from bert_jax import config_lib, config_schema, model_config
from bert_jax.runtime import checkpoints as ckpt_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = config_lib.BUNDLED_CORPUS


def _run(module: str, *args: str, cwd) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  env.pop("BERT_JAX_TRACEBACK", None)
  return subprocess.run(
    [sys.executable, "-m", module, *args],
    capture_output=True,
    text=True,
    timeout=600,
    env=env,
    cwd=cwd,
  )


def _one_line(r: subprocess.CompletedProcess, prog: str) -> str:
  assert r.returncode == 2, r.stderr[-3000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), r.stderr[-3000:]
  return lines[0].removeprefix(f"{prog}: error: ")


# ----------------------------------------------------------------------------- the command line

# The third fault probe's values (issue 46, faults 1 and 2) and their neighbours.
MAIN_REFUSED = [
  ("--config.masking.mode=dynamc", "config.masking.mode='dynamc': must be one of static, dynamic"),
  ("--config.opt.lr=-0.01", "config.opt.lr=-0.01: must be a number > 0"),
  ("--config.opt.b2=1.5", "config.opt.b2=1.5: must be a number in [0, 1)"),
  ("--config.opt.b1=-0.1", "config.opt.b1=-0.1: must be a number in [0, 1)"),
  ("--config.opt.clip_norm=-1", "config.opt.clip_norm=-1.0: must be a number >= 0"),
  (
    "--config.model.attention_dropout_prob=-0.5",
    "config.model.attention_dropout_prob=-0.5: must be a number in [0, 1)",
  ),
  (
    "--config.model.hidden_dropout_prob=1.0",
    "config.model.hidden_dropout_prob=1.0: must be a number in [0, 1) (a dropout probability "
    "of 1 zeroes every activation: nothing trains)",
  ),
  ("--config.ckpt.every_steps=0", "config.ckpt.every_steps=0: must be an integer >= 1"),
  ("--config.log.every_steps=0", "config.log.every_steps=0: must be an integer >= 1"),
  ("--config.eval.every_steps=-1", "config.eval.every_steps=-1: must be an integer >= 0"),
  ("--config.ckpt.keep=0", "config.ckpt.keep=0: must be an integer >= 1"),
  ("--config.ckpt.keep=-1", "config.ckpt.keep=-1: must be an integer >= 1"),
  ("--config.opt.total_steps=0", "config.opt.total_steps=0: must be an integer >= 1"),
  ("--config.opt.name=sgd", "config.opt.name='sgd': must be one of adamw, lamb"),
  ("--config.opt.nonfinite=ignore", "config.opt.nonfinite='ignore': must be one of stop, skip"),
  ("--config.model.kernels=gpu", "config.model.kernels='gpu': must be one of "),
  ("--config.data.eval_fraction=0", "config.data.eval_fraction=0.0: must be a number in (0, 1)"),
  ("--config.opt.warmup_steps=20", "config.opt.warmup_steps=20: must be below"),
  ("--config.masking.max_predictions=65", "config.masking.max_predictions=65: must be at most"),
  ("--config.resume_allow_changes=opt.lrr", "config.resume_allow_changes: 'opt.lrr' is no field"),
  ("--config.seed=4294967296", "config.seed=4294967296: must be an integer in [0, 4294967295]"),
  (
    "--config.objective.ltr=True",
    "config.objective.mlm=True and config.objective.ltr=True: exactly one of them must be True",
  ),
]


@pytest.mark.parametrize("flag, message", MAIN_REFUSED, ids=[f for f, _ in MAIN_REFUSED])
def test_main_refuses_a_bad_value_before_anything_is_written(tmp_path, flag, message):
  r = _run("bert_jax.main", "--config=local:steps=20", "--workdir=wd", flag, cwd=tmp_path)
  assert _one_line(r, "main").startswith(message)
  assert list(tmp_path.iterdir()) == []  # no workdir, no compilation cache, nothing


def test_a_refused_value_leaves_an_existing_run_as_it_was(tmp_path):
  """A rerun with a bad value in a workdir holding a run: every file as it was."""
  wd = tmp_path / "wd"
  (wd / "checkpoints").mkdir(parents=True)
  (wd / "run_status.json").write_text('{"state": "finished", "step": 20, "total_steps": 20}')
  (wd / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 8.0}\n')
  before = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()}
  r = _run("bert_jax.main", "--config=local:steps=20", f"--workdir={wd}", "--config.ckpt.keep=0",
           cwd=tmp_path)  # fmt: skip
  assert _one_line(r, "main").startswith("config.ckpt.keep=0")
  assert {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()} == before
  assert sorted(p.name for p in wd.iterdir()) == ["checkpoints", "metrics.jsonl", "run_status.json"]


CREATE_DATA_REFUSED = [
  ("--max_seq_length=4", "--max_seq_length=4: must be an integer in [8, 65535]"),
  ("--masked_lm_prob=0", "--masked_lm_prob=0.0: must be a number in (0, 1]"),
  ("--short_seq_prob=1.5", "--short_seq_prob=1.5: must be a number in [0, 1]"),
  ("--eval_fraction=1", "--eval_fraction=1.0: must be a number in [0, 1) (0: no eval split)"),
  ("--dupe_factor=0", "--dupe_factor=0: must be an integer >= 1"),
  ("--records_per_shard=0", "--records_per_shard=0: must be an integer >= 1"),
  ("--max_predictions_per_seq=200", "--max_predictions_per_seq=200: must be at most"),
]


@pytest.mark.parametrize(
  "flag, message", CREATE_DATA_REFUSED, ids=[f for f, _ in CREATE_DATA_REFUSED]
)
def test_create_data_refuses_a_bad_flag_before_anything_is_written(tmp_path, flag, message):
  r = _run("bert_jax.create_data", f"--input={CORPUS}", "--output_dir=out", flag, cwd=tmp_path)
  assert _one_line(r, "create_data").startswith(message)
  assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the rules


def test_every_field_of_the_pretraining_base_has_a_rule():
  # (every file of configs/ and experiments/ too: tests/unit/test_experiments.py::_check_buildable)
  for size in ("tiny", "base", "large"):
    c = config_lib.base_config(size)
    config_schema.check_pretraining(c)
    assert config_schema.unchecked_fields(c, config_schema.PRETRAINING) == []


def test_backend_values_are_model_configs_own(monkeypatch):
  """The model's backend fields are checked against model_config's tuples, read at check time
  (another version may change them): a value added there is accepted, one removed refused."""
  c = config_lib.base_config("tiny")
  c.model.kernels = "newkernels"
  with pytest.raises(config_schema.ConfigError, match="must be one of auto, xla"):
    config_schema.check_pretraining(c)
  monkeypatch.setattr(model_config, "KERNELS", (*model_config.KERNELS, "newkernels"))
  config_schema.check_pretraining(c)
  for name, field in (("DROPOUT_RNGS", "dropout_rng"), ("ATTENTION_IMPLS", "attention_impl")):
    c = config_lib.base_config("tiny")
    first = getattr(model_config, name)[1]
    c.model[field] = first
    c.model.attention_dropout_prob = 0.0
    config_schema.check_pretraining(c)
    monkeypatch.setattr(
      model_config, name, tuple(v for v in getattr(model_config, name) if v != first)
    )
    with pytest.raises(config_schema.ConfigError, match=f"config.model.{field}="):
      config_schema.check_pretraining(c)


def test_types_and_unset_values_are_named():
  c = config_lib.base_config("tiny").to_dict()  # plain dicts: a config file's typo
  c["opt"]["lr"] = "1e-4"
  with pytest.raises(
    config_schema.ConfigError, match=r"config.opt.lr='1e-4': must be a number > 0, not a str"
  ):
    config_schema.check_pretraining(c)
  c = config_lib.base_config("tiny")
  c.log.fill_mask = ("no mask here",)
  with pytest.raises(config_schema.ConfigError, match=r"'no mask here' has no \[MASK\]"):
    config_schema.check_pretraining(c)
  c = config_lib.base_config("tiny")
  c.objective.nsp, c.model.type_vocab_size = True, 1
  with pytest.raises(config_schema.ConfigError, match="type_vocab_size=1: must be >= 2"):
    config_schema.check_pretraining(c)
  c = config_lib.base_config("tiny")
  c.data.train_vocab_size = 4096  # with model.vocab_size 30522 and data.input set
  c.data.input = CORPUS
  with pytest.raises(config_schema.ConfigError, match="must equal config.model.vocab_size=30522"):
    config_schema.check_pretraining(c)


def test_checkpointer_refuses_to_keep_nothing(tmp_path):
  """Fault 1 below the config: a Checkpointer keeping 0 (or -1) steps is never made, so no run
  is marked finished with no checkpoint."""
  for keep in (0, -1):
    with pytest.raises(ValueError, match="keeps >= 1 steps"):
      ckpt_lib.Checkpointer(str(tmp_path / "c"), keep=keep)
  assert not (tmp_path / "c").exists()
