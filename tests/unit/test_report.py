"""bert_jax.report on synthetic runs: table values, ablated columns, plots, errors."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax import report
from unit import _report_runs
from unit._report_runs import T5, _config, _seeded_root, _write_results, _write_run

# Shared fixtures (tests/unit/_report_runs.py).
sweep_root = _report_runs.sweep_root


def test_report_writes_markdown_and_plots(sweep_root):
  md, skipped = report.report(sweep_root)
  assert skipped is None
  lines = md.splitlines()
  assert lines[0].startswith("| run | objective.mlm | objective.nsp | objective.ltr | steps |")
  row = next(ln for ln in lines if ln.startswith("| task=mlm_nsp"))
  assert "| 6.6000 |" in row and "| 0.1250 |" in row and "| 445.9 |" in row
  assert "| – |" in row  # no LTR metrics for the MLM run
  out = os.path.join(sweep_root, "report")
  assert open(os.path.join(out, "results.md")).read().strip() == md
  for name in ("train_loss.png", "train_lm_loss.png", "eval_loss.png"):
    with open(os.path.join(out, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert not [f for f in os.listdir(out) if "tmp" in f]
  # A second report skips report/ itself and gives the same table.
  assert report.report(sweep_root) == (md, None)


def test_cli(sweep_root):
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.report", f"--root={sweep_root}"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr
  assert "| task=ltr |" in r.stdout
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.report", f"--root={sweep_root}/nope"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 1 and r.stderr.strip().splitlines() == [
    f"report: error: --root={sweep_root}/nope: no such directory"
  ]


def test_cli_without_matplotlib_writes_the_table(sweep_root):
  code = (
    "import sys; sys.modules['matplotlib'] = None; from bert_jax.report import __main__; "
    f"sys.argv = ['report', '--root={sweep_root}']; __main__.run()"
  )
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  out = os.path.join(sweep_root, "report")
  assert r.stdout.strip().splitlines()[-1] == (
    f"written: {out}/results.md (plots skipped: plots need matplotlib: "
    "pip install 'bert_jax[plots]')"
  )
  assert "| task=ltr |" in open(os.path.join(out, "results.md")).read()
  assert not [f for f in os.listdir(out) if f.endswith(".png")]


# Fine-tuning runs: <root>/<point>/finetune/<task>/results.json, as bert_jax.finetune writes.


def test_plain_finetune_workdir_and_grid(tmp_path):
  # --root = one fine-tuning workdir: no pretraining runs, the point is the run's init.
  wd = str(tmp_path / "rt")
  _write_results(wd, "rotten_tomatoes", "classification", "accuracy", [0.8, 0.9], init="/m/mini")
  # A grid's points under the workdir hold results.json too; the top-level one stands for them.
  _write_results(os.path.join(wd, "lr=5e-05"), "rotten_tomatoes", "classification", "accuracy",
                 [0.1, 0.1])  # fmt: skip
  md, _ = report.report(wd)
  assert md.startswith("## Fine-tuning (test;")
  assert "| /m/mini | 85.0 ± 0.0 (1 x 2) |" in md
  assert "Pretraining" not in md and "lr=5e-05" not in md
  # An unfinished grid (points, no top-level results.json yet): the best on dev is shown,
  # its test numbers, and a note says so.
  grid = str(tmp_path / "grid")
  for point, dev, test in (("lr=2e-05", [0.6], [0.9]), ("lr=5e-05", [0.7], [0.5])):
    _write_results(os.path.join(grid, point), "vitaminc", "classification", "accuracy", test,
                   dev=dev, init="/m/x")  # fmt: skip
  md, _ = report.report(grid)
  assert "| /m/x | 50.0 ± 0.0 (1 x 1) |" in md
  assert md.endswith(
    f"- /m/x / vitaminc: 2 runs, the best on dev shown ({grid}/lr=5e-05/results.json)"
  )


def test_finetune_errors(tmp_path):
  d = tmp_path / "p" / "finetune" / "t"
  d.mkdir(parents=True)
  (d / "results.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"finetune/t/results.json: not valid JSON"):
    report.report(str(tmp_path))
  (d / "results.json").write_text('{"task": "t"}')
  with pytest.raises(ValueError, match="not a fine-tuning results.json"):
    report.report(str(tmp_path))
  with pytest.raises(ValueError, match="--paper=table9: one of table5, table6, masking, wwm"):
    report.report(str(tmp_path), paper="table9")


def test_cli_paper_flag(tmp_path):
  root = _seeded_root(tmp_path, T5)
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.report", f"--root={root}", "--paper=table6", "--split=dev"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr
  assert "| paper: L=24 H=1024 A=16 |" in r.stdout and "## Fine-tuning (dev;" in r.stdout


def test_reference_tokens_and_deadline(tmp_path):
  """Each point's held-out accuracy beside its count-based reference, majority baseline and
  tokens; what a deadline left."""
  root = str(tmp_path)
  for name, (mlm, nsp), acc in (
    ("task=mlm_nsp", (True, True), 0.40),
    ("task=mlm", (True, False), 0.30),
  ):
    cfg = _config(mlm, nsp, False)
    cfg["data"].update(batch_size=16, max_seq_length=128)
    _write_run(root, name, cfg, [
      {"step": 100, "split": "eval", "mlm_accuracy": acc, "mlm_perplexity": 50.0,
       "mlm_reference_accuracy": 0.35, "mlm_reference_accuracy_at_mask": 0.31,
       "mlm_majority_baseline": 0.06},
    ])  # fmt: skip
    _write_results(os.path.join(root, name, "finetune", "rotten_tomatoes"), "rotten_tomatoes",
                   "classification", "accuracy", [0.6, 0.7])  # fmt: skip
  with open(os.path.join(root, "deadline.json"), "w") as f:
    json.dump({"deadline": 1.0, "stopped": "task=ltr", "not_done": ["task=ltr"]}, f)
  md, _ = report.report(root, paper="table5")
  pre = md.split("## Fine-tuning")[0]
  header = pre.splitlines()[2]
  assert header == (
    "| run | objective.nsp | steps | tokens (M) | eval MLM acc | MLM reference acc "
    "| MLM majority acc | eval MLM ppl |"
  )
  assert "| task=mlm_nsp | True | 100 | 0.2 | 0.4000 | 0.3500 | 0.0600 | 50.0000 |" in pre
  assert (
    "- held-out MLM accuracy above the count-based reference on the same targets: 1 of 2 runs "
    "(not: task=mlm); above the majority baseline: 2 of 2"
  ) in pre
  fine = md.split("## Fine-tuning")[1]
  assert "| MLM ppl | MLM acc % | MLM ref % | rotten_tomatoes (SST-2) accuracy |" in fine
  assert "| task=mlm_nsp | True | 50.00 | 40.0 | 35.0 | 65.0 ± 0.0 (1 x 2) |" in fine
  assert md.endswith(
    "## Not run: the sweep's deadline came first (deadline.json; rerun the sweep to finish)"
    "\n\n- task=ltr"
  )
