"""tools/replication/replicate_gpu.sh at toy size: past its deadline it starts no run, and its
summary and each experiment's report list what the deadline left undone."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_deadline_that_has_passed_runs_nothing_and_reports_it(tmp_path, built_replication_data):
  data, root = built_replication_data, tmp_path / "root"
  env = {**os.environ, "PYTHON": sys.executable, "BUDGET_S": "0", "MARGIN_S": "0"}
  r = subprocess.run(
    ["bash", "tools/replication/replicate_gpu.sh", "unused.txt", str(data), str(root)],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stdout + r.stderr
  out = r.stdout
  # The lanes of one stage are skipped; each experiment's last sweep stops (75) and reports.
  for lane in ("pre_table5", "pre_table6a", "pre_table6b", "pre_wwm", "ft_table6", "ft_masking"):
    assert f"{lane}: skipped (past the deadline)" in out
  for exp in ("table5", "table6", "wwm", "masking"):
    assert f"{exp}: exit 75 (deadline: rerun to finish)" in out
  t6 = json.load(open(root / "table6" / "deadline.json"))["not_done"]
  assert t6[0] == "row=tiny" and "row=mini/finetune/brown_pos" in t6
  assert f"table6: not done by the deadline: {', '.join(t6)}" in out
  for exp in ("table5", "table6", "wwm", "masking"):
    assert f"{exp}: report {root}/{exp}/report/results.md" in out
    md = open(root / exp / "report" / "results.md").read()
    assert md.startswith("## Not run: the sweep's deadline came first")
  assert "- pretraining=none/finetune/vitaminc" in open(root / "wwm/report/results.md").read()
  assert not any((root / "table5").glob("task=*/metrics.jsonl"))  # nothing trained
