"""Fault suite, resume mismatches and non-finite gradients: each case a real
`python -m bert_jax.main` run against real files (issue #20)."""

import os
import re
import subprocess

import jax
import numpy as np
from test_train import _env, _main_cmd, _rows

from bert_jax import checkpoints as ckpt_lib
from bert_jax import model as model_lib


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


def test_nonfinite_gradient_stop_saves_no_nan(tiny_data_dir, tmp_path):
  wd = tmp_path / "stop"
  line = _error(_run(wd, tiny_data_dir, 6, *ABSURD))
  m = re.search(r"main: error: non-finite gradient at step 2 \(loss (\S+)\); stopped without", line)
  assert m and np.isfinite(float(m[1])), line  # a finite loss
  assert [r["step"] for r in _rows(wd)] == [1]
  assert _all_finite(wd) == []  # step 2 was never saved


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
