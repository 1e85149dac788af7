"""Fault suite, resume mismatches and non-finite gradients: each case a real
`python -m bert_jax.main` run against real files."""

import contextlib
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import pretraining as pretraining_data
from bert_jax.data import run_data
from bert_jax.tokenizers import tokenizer as tokenizer_lib
from unit.test_train import _env, _main_cmd


def _run(workdir, data_dir, steps, *extra):
  return subprocess.run(
    _main_cmd(workdir, data_dir, steps, list(extra)), env=_env(), capture_output=True, text=True
  )


def _error(r):
  """The one `main: error: ...` line that ends a failed run (absl's log lines aside)."""
  assert r.returncode == 1, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not re.match(r"[IWE]\d{4} ", ln)]
  assert len(lines) == 1 and lines[0].startswith("main: error: "), r.stderr[-2000:]
  return lines[0]


@pytest.fixture(scope="module")
def trained4(tiny_data_dir, tmp_path_factory):
  """A workdir with a checkpoint at step 4 (the tests copy it)."""
  wd = tmp_path_factory.mktemp("resume") / "wd"
  r = _run(wd, tiny_data_dir, 4)
  assert r.returncode == 0, r.stderr[-2000:]
  return wd


def _copy(src, tmp_path, name="wd"):
  dst = tmp_path / name
  shutil.copytree(src, dst)
  return dst


def _build(tiny_data_dir, out, vocab=None, **over):
  """tiny_data_dir's build (conftest) with other options or another vocab."""
  opts = dict(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1, eval_fraction=0.05)
  opts.update(over)
  corpus = os.path.join(os.path.dirname(config_lib.__file__), "data", "sample_public_domain.txt")
  pretraining_data.build(corpus, str(out), vocab=vocab, num_workers=1, progress=False, **opts)
  return str(out)


def test_auto_built_data_not_reused_with_other_options(tmp_path):
  """`<workdir>/data` built from config.data.input is refused when the config asks for other
  build options (it used to be reused silently)."""
  c = config_lib.base_config("tiny")
  c.data.input = config_lib.BUNDLED_CORPUS
  c.data.max_seq_length = 64
  c.masking.max_predictions = 10
  c.data.dupe_factor = 1
  c.data.eval_fraction = 0.05  # as configs/local.py
  wd = tmp_path / "wd"
  pretraining_data.build(
    **run_data.build_options(c),
    output_dir=str(wd / "data"),
    vocab=tokenizer_lib.default_vocab_path(),
    num_workers=1,
    progress=False,
  )
  extra = ["--config.data.input=" + c.data.input, "--config.data.dupe_factor=2"]
  # The data was built with BERT's vocab (local.py would train one of its own).
  cmd = _main_cmd(wd, "", 2, [*extra, "--config.data.train_vocab_size=0"])
  cmd.remove("--config.data.dir=")
  r = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
  line = _error(r)
  # Only the changed option is named (the others were compared and agree).
  assert line.endswith(
    f"{wd / 'data'} was built with other options: dupe_factor 1 -> 2 (built -> config); delete it "
    "to rebuild, or set config.data.dir to the data you want"
  )


@contextlib.contextmanager
def _read_only(path):
  """`path` read-only for this test's processes: a read-only bind mount where we are root
  (root ignores permissions), else the write permissions taken away."""
  if os.geteuid() == 0:
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
      subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
      yield "Read-only file system"
    finally:
      subprocess.run(["umount", str(path)], check=True)
  else:
    subprocess.run(["chmod", "-R", "a-w", str(path)], check=True)
    try:
      yield "Permission denied"
    finally:
      subprocess.run(["chmod", "-R", "u+w", str(path)], check=True)


def _files(root):
  return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _convert(src, dst, *extra):
  cmd = [sys.executable, "-m", "bert_jax.convert", f"--src={src}", f"--dst={dst}", *extra]
  return subprocess.run(cmd, env=_env(), capture_output=True, text=True)


def test_convert_and_finetune_init_fall_back_past_an_empty_newest_step(trained4, tmp_path):
  """37.5: an empty newest step (a copy cut short) is passed over with one warning by convert
  and fine-tuning's config.init, as by the trainer and bert_jax.load: one mechanism
  (checkpoints.load_newest, inside loader.load_checkpoint)."""
  from bert_jax.finetune import inputs as ft_inputs
  from bert_jax.interop import loader
  from unit._finetune_tasks import _splits, finetune_config, sentiment

  wd = _copy(trained4, tmp_path)
  (wd / "checkpoints" / "12").mkdir()
  r = _convert(wd, tmp_path / "hf")
  assert r.returncode == 0, r.stderr[-2000:]
  warned = [ln for ln in r.stderr.splitlines() if "does not restore" in ln]
  assert len(warned) == 1 and f"{wd}/checkpoints/12 does not restore" in warned[0]
  assert "trying step 4" in warned[0]
  step4 = loader.load_checkpoint(wd, 4, scan_layers=False).params
  exported = loader.load_checkpoint(tmp_path / "hf", scan_layers=False).params
  for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(step4), strict=True):
    np.testing.assert_array_equal(a, b)

  c = finetune_config.get_config("custom,seeds=1,size=tiny")
  c.task.train, c.task.dev, c.task.test = _splits(tmp_path, sentiment, (32, 16, 16))
  c.init = str(wd)
  c.data.max_seq_length = 16
  prep = ft_inputs.prepare(c)
  assert prep.cfg.hidden_size == 32 and prep.tokenizer.vocab_size == 30522
  for a, b in zip(jax.tree.leaves(prep.init_params), jax.tree.leaves(step4["bert"]), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)
