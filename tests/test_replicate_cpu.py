"""tools/replication/replicate_cpu.sh, as a dry run (every sweep prints its commands): the new
points split into its two lanes, each once, and then one sweep per experiment for the links
and the report."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pretrained(log: str) -> list[str]:
  """The points a sweep log pretrains: 'table5/task=ltr', ..."""
  return re.findall(r"bert_jax\.main .*--workdir=\S*/root/(\w+/[^/\s]+)$", log, flags=re.M)


@pytest.mark.slow
def test_two_lanes_share_the_new_points_and_every_experiment_reports(
  tmp_path, built_replication_data
):
  data, root = built_replication_data, tmp_path / "root"
  r = subprocess.run(
    ["bash", "tools/replication/replicate_cpu.sh", "unused.txt", str(data), str(root), "--",
     "--dry_run"],
    cwd=REPO,
    env={**os.environ, "PYTHON": sys.executable},
    capture_output=True,
    text=True,
    timeout=900,
  )  # fmt: skip
  assert r.returncode == 0, r.stdout + r.stderr
  lane_a = _pretrained((root / "logs" / "lane_a.log").read_text())
  lane_b = _pretrained((root / "logs" / "lane_b.log").read_text())
  assert lane_a == [
    "table5/task=mlm_nsp", "table5/task=mlm", "table6/row=L2_H256_A4", "masking/mode=dynamic"
  ]  # fmt: skip
  assert lane_b == ["table5/task=ltr", "wwm/whole_word=True", "table6/row=L4_H128_A2"]
  # The lanes fine-tune what they pretrain (the control with the baseline, the BiLSTM row with
  # LTR) and write no report.
  a_log = (root / "logs" / "lane_a.log").read_text()
  b_log = (root / "logs" / "lane_b.log").read_text()
  assert "table5/pretraining=none/finetune/brown_pos" in a_log
  assert "table5/task=ltr_bilstm/finetune/rotten_tomatoes" in b_log
  assert "bert_jax.report" not in a_log + b_log
  for exp in ("table5", "wwm", "table6", "masking"):
    assert f"bert_jax.report --root={root}/{exp}" in r.stdout
  assert "lane a: exit 0" in r.stdout and "lane b: exit 0" in r.stdout
