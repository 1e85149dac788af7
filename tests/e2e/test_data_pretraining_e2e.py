"""The end-to-end half of tests/unit/test_data_pretraining.py (real processes; slow): see its
docstring."""

import json
import subprocess

import pytest
from unit.test_data_pretraining import CORPUS
from unit.test_runtime_preemption import default_cmd
from unit.test_train import _env


@pytest.mark.slow
def test_trainer_skips_a_binary_corpus_file_as_create_data_does(tmp_path):
  """37.5: the bundled default (a vocab trained on the corpus, then its data) with a binary
  file among its inputs trains, the file skipped with a warning by both steps."""
  binary = tmp_path / "bin.dat"
  binary.write_bytes(b"\x00\x01\x02 binary \x00 data\n" * 100)
  wd = tmp_path / "wd"
  cmd = default_cmd(wd, f"--config.data.input={CORPUS},{binary}")
  r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"{binary} looks binary (NUL bytes): skipped" in r.stderr
  meta = json.loads((wd / "data" / "metadata.json").read_text())
  assert meta["skipped"] == {"binary_files": 1}
  assert json.loads((wd / "run_status.json").read_text())["state"] == "finished"
