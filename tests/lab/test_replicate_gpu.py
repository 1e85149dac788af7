"""tools/replication/replicate_gpu.sh on a CPU at toy size: --prepare builds the data and tasks
it carries, then one call pretrains Table 5's baseline point for a few steps, fine-tunes it and
the no-pretraining control on two tasks (TASKS), writes the reports, and copies the results (no
checkpoints) to $OUT; a call past its deadline starts nothing."""

import json
import os
import subprocess
import sys

import pytest

from lab._replication import CORPUS, REPO, TASK_ROOT, TOY


def _run(args, env, timeout=2400):
  return subprocess.run(
    ["bash", "tools/replication/replicate_gpu.sh", *args],
    cwd=REPO,
    env={**os.environ, "PYTHON": sys.executable, "WHEELS": "", **env},  # not the GPU's cp312
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile(CORPUS), reason="needs ../shared/data")
def test_a_call_trains_fine_tunes_reports_and_copies_the_results(tmp_path):
  data, root, out = tmp_path / "gpu_data", tmp_path / "runs", tmp_path / "out"
  env = {"DATA": str(data), "ROOT": str(root), "OUT": str(out), "DOCS": "12", "LANES": "2"}
  r = _run(["--prepare", CORPUS, TASK_ROOT], env)
  assert r.returncode == 0, r.stdout + r.stderr
  for f in ("corpus.txt", "vocab.txt", "nsp/metadata.json", "tasks/squad_qnli/test.jsonl.gz",
            "tasks/squad_split/dev.json.gz", "tasks/brown_pos/train.jsonl.gz"):  # fmt: skip
    assert (data / f).is_file(), f
  # Two of the tasks (a classification, the span QA): each process starts JAX anew.
  tasks = ("squad_qnli", "squad_split")
  env.update(QUEUE_FILTER="^table5 task=mlm_nsp,seed=0$", TASKS="+".join(tasks))
  env.update(BUDGET_S="2400", MARGIN_S="60")
  r = _run(["--", *TOY], env)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "exit 0;" in r.stdout and "done" in r.stdout, r.stdout
  got = out / "replication" / "table5"
  point = got / "task=mlm_nsp,seed=0"
  rows = [json.loads(ln) for ln in open(point / "metrics.jsonl")]
  assert [r["step"] for r in rows if r["split"] == "train"][-1] == 4  # it trained
  assert "mlm_accuracy" in [r for r in rows if r["split"] == "eval"][-1]
  for row in ("task=mlm_nsp,seed=0", "pretraining=none,seed=0"):
    for task in tasks:
      res = json.load(open(got / row / "finetune" / task / "results.json"))
      assert res["task"] == task and res["seeds"], (row, task)
  assert not list(out.rglob("checkpoints")) and not list(out.rglob("*.msgpack"))
  md = (got / "report" / "results.md").read_text()
  assert "pretraining beats no pretraining" in md and "(1 x 1)" in md
  verdicts = (out / "replication" / "report" / "verdicts.md").read_text()
  assert verdicts.startswith("## Verdicts (test split; ")
  assert "inconclusive (one pretraining run)" in verdicts
  # Past its deadline a call starts nothing and says what is left.
  env.update(QUEUE_FILTER="^table5 task=mlm,seed=0$", BUDGET_S="0", MARGIN_S="0")
  r = _run(["--", *TOY], env)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "left: rerun the same command" in r.stdout
  assert not (root / "table5" / "task=mlm,seed=0" / "metrics.jsonl").exists()
  timeline = (root / "logs" / "timeline.tsv").read_text()
  assert "skipped (deadline)\tpretrain\ttable5\ttask=mlm,seed=0" in timeline
