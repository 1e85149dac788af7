"""The end-to-end half of tests/unit/test_runtime_resume.py (real processes; slow): see its
docstring."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from unit import test_runtime_resume as unit_runtime_resume
from unit.test_runtime_resume import (
  _build,
  _convert,
  _copy,
  _error,
  _files,
  _read_only,
  _run,
)
from unit.test_train import _env, _main_cmd, _params, _rows, _run_two_processes

from bert_jax import config_lib
from bert_jax import model as model_lib
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.tokenizers import tokenizer as tokenizer_lib

# The unit half's fixture, shared here.
trained4 = unit_runtime_resume.trained4


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


@pytest.mark.slow
def test_other_tokenizer_refused_on_resume_and_init_from(trained4, tiny_data_dir, tmp_path):
  """Data built with another vocab of the same size (two tokens swapped) is refused."""
  vocab = tmp_path / "vocab.txt"
  lines = open(tokenizer_lib.default_vocab_path()).read().splitlines(keepends=True)
  lines[2000], lines[2001] = lines[2001], lines[2000]
  vocab.write_text("".join(lines))
  other = _build(tiny_data_dir, tmp_path / "other_tok", vocab=str(vocab))
  wd = _copy(trained4, tmp_path)
  line = _error(_run(wd, other, 8))
  assert "would not be exact: tokenizer " in line and "resume_allow_changes=tokenizer" in line
  line = _error(_run(tmp_path / "fresh", other, 2, f"--config.init_from={trained4}"))
  assert f"init_from {trained4}: its tokenizer (fingerprint" in line


@pytest.mark.slow
def test_convert_refuses_to_replace_a_runs_live_files(trained4, tmp_path):
  """37.5: `convert --dst=<workdir>/checkpoints/4 --overwrite` replaced a live checkpoint with
  an export. A checkpoint step, a new step name under checkpoints/ (the trainer would take it
  for its newest step), the source's workdir and another training workdir are refused in one
  line, --overwrite or not; nothing of either run changes."""
  wd = _copy(trained4, tmp_path)
  other = _copy(trained4, tmp_path, "other")
  before = {**_files(wd), **_files(other)}
  refused = {
    wd / "checkpoints" / "4": f"is inside {wd}/checkpoints, a training run's checkpoints: write "
    "the export elsewhere (the trainer would take it for a step)",
    wd / "checkpoints" / "200": f"is inside {wd}/checkpoints, a training run's checkpoints: "
    "write the export elsewhere (the trainer would take it for a step)",
    wd: f"holds --src={wd}: write the export elsewhere",
    other: "is a training workdir: refusing to replace it; write the export elsewhere",
  }
  for dst, why in refused.items():
    r = _convert(wd, dst, "--overwrite")
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == f"convert: error: --dst={dst} {why}"
  assert {**_files(wd), **_files(other)} == before
  assert sorted(os.listdir(wd / "checkpoints")) == ["4"]


@pytest.mark.slow
def test_resume_onto_data_rebuilt_from_an_edited_text_is_refused(trained4, tiny_data_dir, tmp_path):
  """37.3: create_data --overwrite into the run's data directory from the corpus with one word
  of one document edited (same options, same split sizes: only the text's content hash
  differs). The rerun used to resume without a word and diverge; it stops in one line naming
  the hashes, and nothing in the workdir changes."""
  data = shutil.copytree(tiny_data_dir, tmp_path / "data")
  wd = _copy(trained4, tmp_path)
  corpus = os.path.join(os.path.dirname(config_lib.__file__), "data", "sample_public_domain.txt")
  edited = tmp_path / "edited.txt"
  edited.write_text(open(corpus).read().replace("Alice", "Carol", 1))
  build = [sys.executable, "-m", "bert_jax.create_data", f"--input={edited}"]
  build += [f"--output_dir={data}", "--overwrite", "--noprogress", "--num_workers=1"]
  build += ["--max_seq_length=64", "--max_predictions_per_seq=10", "--eval_fraction=0.05"]
  r = subprocess.run(build, env=_env(), capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  new_meta = json.loads((data / "metadata.json").read_text())
  old_meta = json.loads(open(os.path.join(tiny_data_dir, "metadata.json")).read())
  assert new_meta["splits"] == old_meta["splits"]  # the same sizes: only the content tells
  before = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()}
  line = _error(_run(wd, data, 8))
  old_sha, new_sha = (m["source"]["input_sha256"][:12] for m in (old_meta, new_meta))
  assert line == (
    f"main: error: resuming {wd}/checkpoints/4 would not be exact: dataset.input_sha256 "
    f"{old_sha!r} -> {new_sha!r} (checkpoint -> now); restore the old values, use a new workdir, "
    "or allow it with --config.resume_allow_changes=dataset.input_sha256"
  )
  assert {p: p.read_bytes() for p in before} == before
  assert sorted(p for p in wd.rglob("*") if p.is_file()) == sorted(before)


@pytest.mark.slow
def test_refused_or_failed_rerun_keeps_the_finished_record(trained4, tiny_data_dir, tmp_path):
  """run_status.json of a finished run survives a rerun that is refused (a changed warmup) or
  fails (no checkpoint restores): bad input writes nothing."""
  wd = _copy(trained4, tmp_path)
  status = (wd / "run_status.json").read_bytes()
  assert json.loads(status)["state"] == "finished"
  files = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file() and "checkpoints" not in p.parts}
  line = _error(_run(wd, tiny_data_dir, 4, "--config.opt.warmup_steps=3"))
  assert "opt.warmup_steps" in line, line
  assert {p: p.read_bytes() for p in files} == files  # every file as it was
  for step_dir in (wd / "checkpoints").iterdir():  # now no checkpoint restores
    for f in step_dir.rglob("*"):
      if f.is_file() and f.stat().st_size > 100:
        f.write_bytes(f.read_bytes()[:100])
  line = _error(_run(wd, tiny_data_dir, 4))
  assert "no checkpoint in" in line, line
  assert (wd / "run_status.json").read_bytes() == status
  assert not (wd / "bert_jax.lock").exists()


@pytest.mark.slow
def test_a_read_only_finished_run(trained4, tiny_data_dir, tmp_path):
  """37.5: rerunning a finished run whose workdir is read-only (an archive, a read-only mount)
  has nothing to write: it says so and ends with the final checkpoint's fill-mask lines, instead
  of `[Errno 30] Read-only file system: .../bert_jax.lock`. Asked to train on, it is one line."""
  wd = _copy(trained4, tmp_path)
  before = _files(wd)
  with _read_only(wd) as reason:
    r = _run(wd, tiny_data_dir, 4)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{wd} holds this run, finished at step 4, read-only: nothing to do" in r.stdout
    assert "fill_mask: " in r.stdout
    line = _error(_run(wd, tiny_data_dir, 8))
    assert line == (
      f"main: error: cannot create the lock {wd}/bert_jax.lock: {reason}: training needs a "
      "writable workdir"
    )
  assert _files(wd) == before
