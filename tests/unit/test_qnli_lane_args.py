"""tools/replication/qnli_lane.sh refuses a BATCH it cannot size its passes of pairs from, a
STEPS that is not a whole number of its 36,000-step recipe and an EVAL_EXAMPLES that is not a
count, in one line, before anything is built or run."""

import os
import pathlib
import subprocess

import pytest

REPO = str(pathlib.Path(__file__).resolve().parents[2])
BATCH = "a positive multiple of 8 (16 here, 64 on a GPU)"


@pytest.mark.parametrize(
  "name, value, message",
  [
    ("BATCH", "abc", BATCH),
    ("BATCH", "0", BATCH),
    ("BATCH", "12", BATCH),
    ("BATCH", "-16", BATCH),
    ("STEPS", "1000", "a positive multiple of 36000"),
    ("STEPS", "0", "a positive multiple of 36000"),
    ("EVAL_EXAMPLES", "all", "a count (0: every dev and test pair)"),
  ],
)
def test_a_bad_setting_is_refused_before_anything_runs(tmp_path, name, value, message):
  data = tmp_path / "lane_data"
  r = subprocess.run(
    ["bash", "tools/replication/qnli_lane.sh", "--prepare"],
    cwd=REPO,
    env={**os.environ, name: value, "DATA": str(data)},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert r.returncode == 2
  assert r.stderr == f"qnli_lane.sh: error: {name}={value}: {message}\n"
  assert not data.exists()
