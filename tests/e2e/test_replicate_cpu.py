"""tools/replication/replicate_cpu.sh, as a dry run (every sweep prints its commands): the
queue's order (the cheap compared points' seeds first, the points pretrained once last), each
pretraining config once, both lanes used, then the links and the reports."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = str(pathlib.Path(__file__).resolve().parents[2])


@pytest.mark.slow
def test_the_queue_runs_in_two_lanes_then_links_and_reports(tmp_path, built_replication_data):
  data, root = built_replication_data, tmp_path / "root"
  (data / "tasks" / "squad_split").mkdir(parents=True)
  (data / "tasks" / "squad_split" / "meta.json").write_text("{}")
  for task in ("brown_pos", "rotten_tomatoes", "vitaminc"):
    (data / "tasks" / task).mkdir()
    (data / "tasks" / task / "test.jsonl.gz").write_text("")
  r = subprocess.run(
    ["bash", "tools/replication/replicate_cpu.sh", "unused.txt", str(data), str(root), "--",
     "--dry_run"],
    cwd=REPO,
    env={**os.environ, "PYTHON": sys.executable, "STAGES": "pretrain finetune"},
    capture_output=True,
    text=True,
    timeout=900,
  )  # fmt: skip
  assert r.returncode == 0, r.stdout + r.stderr
  queue = (root / "logs" / "queue_pretrain.txt").read_text().splitlines()
  # The cheapest compared point (Table 6's 1-layer row) with all its seeds first, then the
  # points of tiny's cost seed by seed (Table 5's MLM rows, dynamic and whole-word masking),
  # then LTR.
  tiny = ("table5 task=mlm_nsp", "table5 task=mlm", "masking mode=dynamic", "wwm whole_word=True")
  assert queue == [f"table6 row=L1_H128_A2,seed={s}" for s in range(3)] + [
    f"{p},seed={s}" for s in range(3) for p in tiny
  ] + [f"table5 task=ltr,seed={s}" for s in range(3)]  # fmt: skip
  assert not any("row=tiny" in q or "mode=static" in q for q in queue)
  timeline = (root / "logs" / "timeline.tsv").read_text().splitlines()
  starts = [ln.split("\t") for ln in timeline if "\tstart\t" in ln]
  started = [f"{s[3]} {s[4]}" for s in starts if s[2] == "pretrain"]
  assert sorted(started) == sorted(queue)
  # Two lanes take the queue in its order; their start lines may swap neighbours under load.
  assert all(abs(started.index(q) - i) < 2 for i, q in enumerate(queue)), started
  assert all(ln.endswith("\t0") for ln in timeline if "\tend\t" in ln)
  log = (root / "logs" / "pretrain" / "table6_row_L1_H128_A2_seed_2.log").read_text()
  assert re.search(r"bert_jax\.main .*row=L1_H128_A2,seed=2 --workdir=\S*/table6/", log)
  ft = (root / "logs" / "finetune" / "table5_task_mlm_nsp_seed_1.log").read_text()
  assert "pretraining=none,seed=1/finetune/squad_qnli" in ft
  # The links: every experiment's whole sweep, with Table 5's root to reuse.
  link = (root / "logs" / "link.log").read_text()
  assert "row=tiny,seed=2/finetune/brown_pos" in link
  assert "links: exit 0" in r.stdout
