"""tools/replication/qnli_lane.sh refuses a BATCH it cannot size its passes of pairs from, a
STEPS that is not a whole number of its 36,000-step recipe and an EVAL_EXAMPLES that is not a
count, in one line, before anything is built or run."""

import os
import pathlib
import subprocess

import pytest

REPO = str(pathlib.Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("batch", ["abc", "0", "12", "-16"])
def test_a_bad_batch_is_refused_before_anything_runs(tmp_path, batch):
  data = tmp_path / "lane_data"
  r = subprocess.run(
    ["bash", "tools/replication/qnli_lane.sh", "--prepare"],
    cwd=REPO,
    env={**os.environ, "BATCH": batch, "DATA": str(data)},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert r.returncode == 2
  assert (
    r.stderr
    == f"qnli_lane.sh: error: BATCH={batch}: a positive multiple of 8 (16 here, 64 on a GPU)\n"
  )
  assert not data.exists()


@pytest.mark.parametrize(
  "env, message",
  [
    ({"STEPS": "1000"}, "STEPS=1000: a positive multiple of 36000"),
    ({"STEPS": "0"}, "STEPS=0: a positive multiple of 36000"),
    ({"EVAL_EXAMPLES": "all"}, "EVAL_EXAMPLES=all: a count (0: every dev and test pair)"),
  ],
)
def test_bad_steps_or_eval_examples_are_refused_before_anything_runs(tmp_path, env, message):
  data = tmp_path / "lane_data"
  r = subprocess.run(
    ["bash", "tools/replication/qnli_lane.sh", "--prepare"],
    cwd=REPO,
    env={**os.environ, **env, "DATA": str(data)},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert r.returncode == 2
  assert r.stderr == f"qnli_lane.sh: error: {message}\n"
  assert not data.exists()
