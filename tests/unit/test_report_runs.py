"""bert_jax.report.runs: finding pretraining and fine-tuning runs, reading metrics.jsonl."""

import pytest

from bert_jax.report import runs as runs_lib


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such directory"):
    runs_lib.find_runs(str(tmp_path / "absent"))
  with pytest.raises(ValueError, match="no run"):
    runs_lib.find_runs(str(tmp_path))
  bad = tmp_path / "r"
  bad.mkdir()
  (bad / "metrics.jsonl").write_text('{"step": 1, "split": "train"}\nnot json\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics row"):
    runs_lib.find_runs(str(tmp_path))
