"""The end-to-end half of tests/unit/test_runtime_resume.py (real processes; slow): see its
docstring."""

import json
import os
import re
import shutil
import subprocess

import jax
import numpy as np
import pytest
from unit.test_runtime_resume import _build, _copy, _error, _run
from unit.test_train import _env, _main_cmd, _params, _rows, _run_two_processes

from bert_jax import config_lib
from bert_jax import model as model_lib
from bert_jax.runtime import checkpoints as ckpt_lib


@pytest.mark.slow
def test_changed_config_refused_then_allowed_and_recorded(trained4, tiny_data_dir, tmp_path):
  wd = _copy(trained4, tmp_path)
  original = (wd / "config.json").read_text()
  line = _error(_run(wd, tiny_data_dir, 8, "--config.opt.lr=0.002", "--config.opt.b2=0.98"))
  assert "opt.b2 0.999 -> 0.98; opt.lr 0.001 -> 0.002" in line
  assert "--config.resume_allow_changes=opt.b2,opt.lr" in line
  assert ckpt_lib.read_meta(str(wd))[1] == 4  # nothing trained

  r = _run(
    wd,
    tiny_data_dir,
    8,
    "--config.opt.lr=0.002",
    "--config.resume_allow_changes=opt.lr",
    "--config.log.every_steps=2",
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert "keep it exact: log.every_steps 1 -> 2; opt.total_steps 4 -> 8" in r.stdout
  assert "allowed by config.resume_allow_changes: opt.lr 0.001 -> 0.002" in r.stdout
  assert ckpt_lib.read_meta(str(wd))[1] == 8
  assert (wd / "config.json").read_text() == original  # the run's original config
  changes = [json.loads(ln) for ln in (wd / "config_changes.jsonl").read_text().splitlines()]
  assert changes == [
    {
      "step": 4,
      "changes": {
        "log.every_steps": [1, 2],
        "opt.lr": [0.001, 0.002],
        "opt.total_steps": [4, 8],
        "resume_allow_changes": ["", "opt.lr"],
      },
    }
  ]


@pytest.mark.slow
def test_other_data_options_refused_moved_data_accepted(trained4, tiny_data_dir, tmp_path):
  other = _build(tiny_data_dir, tmp_path / "dupe2", dupe_factor=2)
  wd = _copy(trained4, tmp_path)
  line = _error(_run(wd, other, 8))
  assert "dataset.dupe_factor 1 -> 2" in line and "dataset.splits.train.num_sequences" in line
  # The same data under another path is the same data: resumes, and a path that names the
  # same content is no change (nothing reported, nothing recorded).
  moved = shutil.copytree(tiny_data_dir, tmp_path / "moved")
  r = _run(wd, moved, 5)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "Resumed from" in r.stdout and "data.dir" not in r.stdout
  assert "keep it exact: opt.total_steps 4 -> 5" in r.stdout
  changes = [json.loads(ln) for ln in (wd / "config_changes.jsonl").read_text().splitlines()]
  assert changes == [{"step": 4, "changes": {"opt.total_steps": [4, 5]}}]


@pytest.mark.slow
def test_the_bundled_text_under_another_path_is_no_change(tmp_path):
  """38.5: the default builds its data from the bundled corpus, keyed by content; rerun after
  `pip install -e .` it reads the same text from the checkout instead of site-packages. That
  path change is no change: resumed, nothing reported or recorded about data.input."""
  corpus = os.path.join(os.path.dirname(config_lib.__file__), "data", "sample_public_domain.txt")
  paths = []
  for where in ("site-packages", "checkout"):
    (tmp_path / where).mkdir()
    paths.append(shutil.copy(corpus, tmp_path / where / "sample_public_domain.txt"))
  wd = tmp_path / "wd"
  extra = ["--config.data.train_vocab_size=0", "--config.data.dupe_factor=1"]
  for path, steps in zip(paths, (2, 3), strict=True):
    cmd = _main_cmd(wd, "", steps, [f"--config.data.input={path}", *extra])
    cmd.remove("--config.data.dir=")
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
  assert "Resumed from" in r.stdout and "data.input" not in r.stdout
  assert "Resume changes that keep it exact: opt.total_steps 2 -> 3" in r.stdout
  changes = [json.loads(ln) for ln in (wd / "config_changes.jsonl").read_text().splitlines()]
  assert changes == [{"step": 2, "changes": {"opt.total_steps": [2, 3]}}]


def _all_finite(workdir):
  """[(step, all params finite)] of every checkpoint in `workdir`."""
  steps = sorted(int(p) for p in os.listdir(workdir / "checkpoints") if p.isdigit())
  leaves = lambda s: jax.tree.leaves(_params_at(workdir, s))
  return [(s, all(np.isfinite(x).all() for x in leaves(s))) for s in steps]


def _params_at(workdir, step):
  meta, _, _ = ckpt_lib.read_meta(str(workdir), step)
  target = ckpt_lib.single_device_target(
    model_lib.abstract_params(ckpt_lib.bert_config_from_meta(meta))
  )
  return jax.tree.map(np.asarray, ckpt_lib.restore_params(str(workdir), target, step)[0])


# lr 1e8: step 1 moves the weights to ~1e8; step 2's loss is finite (~1e17) but its gradient
# overflows -- a real cause, no injection. Before the guard, step 2's checkpoint held NaNs.
ABSURD = ("--config.opt.lr=1e8", "--config.opt.warmup_steps=0", "--config.ckpt.every_steps=2")


@pytest.mark.slow
def test_nonfinite_gradient_stop_saves_no_nan(tiny_data_dir, tmp_path):
  wd = tmp_path / "stop"
  line = _error(_run(wd, tiny_data_dir, 6, *ABSURD))
  m = re.search(r"main: error: non-finite update at step 2 \(loss (\S+), gradient norm", line)
  assert m and np.isfinite(float(m[1])), line  # a finite loss
  assert [r["step"] for r in _rows(wd)] == [1]
  assert _all_finite(wd) == []  # step 2 was never saved


@pytest.mark.slow
def test_nonfinite_gradient_skip_counts_and_saves_no_nan(tiny_data_dir, tmp_path):
  wd = tmp_path / "skip"
  r = _run(wd, tiny_data_dir, 6, *ABSURD, "--config.opt.nonfinite=skip")
  assert r.returncode == 0, r.stderr[-2000:]
  rows = _rows(wd)
  assert [x["step"] for x in rows] == list(range(1, 7))
  assert [x["skipped_steps"] for x in rows] == [0, 1, 1, 1, 1, 1]
  assert _all_finite(wd) == [(4, True), (6, True)]
  # Skipped steps leave the params exactly as step 1 left them.
  p4 = _params_at(wd, 4)
  p6 = _params_at(wd, 6)
  for a, b in zip(jax.tree.leaves(p4), jax.tree.leaves(p6), strict=True):
    np.testing.assert_array_equal(a, b)


# A finite gradient, a non-finite update: Adam with eps 0 divides 0 by 0 wherever a gradient is
# exactly zero (the embedding rows of tokens not in the batch), already at step 1. Before the
# guard looked past the gradient, 'skip' saved NaN parameters in every checkpoint and 'stop'
# saved step 1's.
ZERO_EPS = ("--config.opt.eps=0.0", "--config.opt.warmup_steps=0", "--config.ckpt.every_steps=2")


@pytest.mark.slow
def test_nonfinite_update_with_a_finite_gradient_stops_unsaved(tiny_data_dir, tmp_path):
  wd = tmp_path / "stop"
  line = _error(_run(wd, tiny_data_dir, 6, *ZERO_EPS))
  m = re.search(r"non-finite update at step 1 \(loss (\S+), gradient norm (\S+)\)", line)
  assert m and np.isfinite(float(m[1])) and np.isfinite(float(m[2])), line
  assert not (wd / "checkpoints").exists() or _all_finite(wd) == []
  assert not (wd / "run_status.json").exists()


@pytest.mark.slow
def test_nonfinite_update_skip_mode_is_bounded_and_saves_no_nan(tiny_data_dir, tmp_path):
  """Every update is non-finite: 'skip' skips them, saves only finite (= initial) params, and
  ends the run once opt.max_consecutive_skips steps in a row were skipped, not "finished"."""
  wd = tmp_path / "skip"
  extra = (*ZERO_EPS, "--config.opt.nonfinite=skip", "--config.opt.max_consecutive_skips=5")
  line = _error(_run(wd, tiny_data_dir, 40, *extra))
  assert "5 steps in a row up to step 5 had a non-finite update and were skipped" in line, line
  assert [x["skipped_steps"] for x in _rows(wd)] == [1, 1, 1, 1]  # a row per step up to 4
  assert _all_finite(wd) == [(2, True), (4, True)]
  for a, b in zip(
    jax.tree.leaves(_params_at(wd, 2)), jax.tree.leaves(_params_at(wd, 4)), strict=True
  ):
    np.testing.assert_array_equal(a, b)  # nothing was applied
  assert not (wd / "run_status.json").exists()


@pytest.mark.slow
def test_process_count_1x8_to_2x4_resumes(trained4, tiny_data_dir, tmp_path):
  """Saved by 1 process x 8 devices, resumed by 2 processes x 4: the same batches and losses
  as resuming with 1 x 8."""
  mesh = "--config.mesh.shape=(2,4,1)"
  one = _copy(trained4, tmp_path, "one")
  r = _run(one, tiny_data_dir, 8, "--num_cpu_devices=8", mesh)
  assert r.returncode == 0, r.stderr[-2000:]
  two = _copy(trained4, tmp_path, "two")
  results = _run_two_processes(two, tiny_data_dir, 8, [mesh])
  for code, _, err in results:
    assert code == 0, err[-3000:]
  assert "Resumed from" in results[0][1]
  a, b = _rows(one), _rows(two)
  assert [r["step"] for r in b] == list(range(1, 9))
  np.testing.assert_allclose([r["mlm_loss"] for r in b], [r["mlm_loss"] for r in a], rtol=2e-5)
  np.testing.assert_allclose([r["nsp_loss"] for r in b], [r["nsp_loss"] for r in a], rtol=2e-5)
  assert _params(two)[0] == 8
