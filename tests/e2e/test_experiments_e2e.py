"""The end-to-end half of tests/unit/test_experiments.py (real processes; slow): see its
docstring."""

import json
import math
import os
import subprocess
import sys

import pytest
from unit import test_experiments as unit_experiments
from unit.test_experiments import REPO, SEQ, _load

from bert_jax import train

# The unit half's fixture, shared here.
datasets = unit_experiments.datasets


TRAIN_OVERRIDES = {
  "opt.total_steps": 2,
  "opt.warmup_steps": 1,
  "data.batch_size": 8,
  "data.max_seq_length": SEQ,
  "eval.every_steps": 0,  # only the final eval
  "eval.max_batches": 1,
  "log.every_steps": 1,
  "ckpt.async_save": False,
  "model.vocab_size": 30522,  # the test data's (BERT's vocab), not the scale's trained one
}


def _train(path, arg, data_dir, workdir):
  c = _load(path).get_config(arg)
  c.data.dir = data_dir
  for k, v in TRAIN_OVERRIDES.items():
    section, key = k.split(".")
    c[section][key] = v
  return c, train.train_and_evaluate(c, str(workdir))


def _rows(workdir, split):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["split"] == split]


@pytest.mark.slow
@pytest.mark.parametrize(
  "name,arg,nsp",
  [
    ("table6_model_size", "row=L1_H128_A2,scale=cpu", True),
    ("masking_static_vs_dynamic", "mode=dynamic,scale=cpu", True),
    ("whole_word_masking", "whole_word=True,scale=cpu", True),
  ],
)
def test_train_one_point(name, arg, nsp, datasets, tmp_path):
  path = os.path.join(REPO, "experiments", f"{name}.py")
  c, out = _train(path, arg, datasets[nsp], tmp_path)
  assert out["step"] == 2
  # A fresh model predicts ~uniformly over the 30,522 tokens: loss near ln(V) = 10.3.
  assert 9.0 < out["train"]["mlm_loss"] < 11.5 and 0.4 < out["train"]["nsp_loss"] < 1.2
  assert 0.0 <= out["eval"]["mlm_accuracy"] <= 0.2 and "nsp_accuracy" in out["eval"]
  assert [r["step"] for r in _rows(tmp_path, "train")] == [1, 2]
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["masking"]["mode"] == c.masking.mode
  assert saved["masking"]["whole_word"] == c.masking.whole_word
  assert saved["model"]["num_layers"] == c.model.num_layers


@pytest.mark.slow
def test_sweep_and_report_end_to_end(datasets, tmp_path):
  """Table 5's LTR point through launch/sweep.py -> bert_jax.main, then bert_jax.report."""
  root = tmp_path / "table5"
  cmd = [
    sys.executable,
    os.path.join(REPO, "launch", "sweep.py"),
    f"--experiment={REPO}/experiments/table5_pretraining_tasks.py:scale=cpu",
    f"--root={root}",
    "--only=ltr",
    "--stages=pretrain,report",
    f"--config.data.dir={datasets[False]}",
    *(f"--config.{k}={v}" for k, v in TRAIN_OVERRIDES.items()),
  ]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
  assert r.returncode == 0, r.stderr[-3000:]
  run = root / "task=ltr,seed=0"  # scale=cpu pretrains every point with seeds 0, 1, 2
  assert (run / "sweep_done.json").exists()
  train_rows = _rows(run, "train")
  assert [r["step"] for r in train_rows] == [1, 2]
  assert 9.0 < train_rows[-1]["ltr_loss"] < 11.5 and "nsp_loss" not in train_rows[-1]
  (ev,) = _rows(run, "eval")
  assert math.isclose(ev["ltr_perplexity"], math.exp(ev["ltr_loss"]), rel_tol=1e-4)
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.report", f"--root={root}"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| task=ltr,seed=0 |"))
  assert f"| {train_rows[-1]['ltr_loss']:.4f} |" in row
  assert (root / "report" / "train_loss.png").exists()
