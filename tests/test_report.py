"""bert_jax.report on synthetic runs: table values, ablated columns, plots, errors."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax import report


def _write_run(root, name, config, rows):
  d = os.path.join(root, name)
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


def _config(mlm, nsp, ltr):
  return {
    "seed": 0,
    "objective": {"mlm": mlm, "nsp": nsp, "ltr": ltr},
    "model": {"num_layers": 2, "hidden_size": 128},
    "mesh": {"shape": [1, -1, 1]},
    "data": {"dir": f"/data/{nsp}"},  # differs, but is not an ablation
  }


@pytest.fixture
def sweep_root(tmp_path):
  root = str(tmp_path)
  _write_run(
    root,
    "task=mlm_nsp",
    _config(True, True, False),
    [
      {"step": 10, "split": "train", "mlm_loss": 7.0, "nsp_loss": 0.7, "mlm_accuracy": 0.05},
      {"step": 10, "split": "perf", "steps_per_sec": 3.0},
      {"step": 20, "split": "train", "mlm_loss": 6.0, "nsp_loss": 0.6, "mlm_accuracy": 0.1},
      {
        "step": 20,
        "split": "eval",
        "mlm_loss": 6.1,
        "mlm_accuracy": 0.125,
        "mlm_perplexity": 445.9,
        "nsp_loss": 0.65,
        "nsp_accuracy": 0.625,
      },
    ],
  )
  _write_run(
    root,
    "task=ltr",
    _config(False, False, True),
    [
      {"step": 10, "split": "train", "ltr_loss": 6.5},
      {"step": 30, "split": "train", "ltr_loss": 5.25},
      {"step": 30, "split": "eval", "ltr_loss": 5.5, "ltr_accuracy": 0.2, "ltr_perplexity": 244.7},
    ],
  )
  return root


def test_table_values_and_ablated_fields(sweep_root):
  runs = report.find_runs(sweep_root)
  assert [r.name for r in runs] == ["task=ltr", "task=mlm_nsp"]
  header, rows = report.table(runs)
  # Only the fields that differ (data.dir is ignored: not an ablation).
  assert header[:4] == ["run", "objective.mlm", "objective.nsp", "objective.ltr"]
  by_name = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
  bert = by_name["task=mlm_nsp"]
  assert bert["objective.nsp"] is True and bert["steps"] == 20
  assert bert["train loss"] == pytest.approx(6.6)  # final MLM + NSP, not the first row
  assert bert["eval MLM acc"] == 0.125 and bert["eval MLM ppl"] == 445.9
  assert bert["eval NSP acc"] == 0.625 and bert["eval LTR acc"] is None
  ltr = by_name["task=ltr"]
  assert ltr["train loss"] == 5.25 and ltr["steps"] == 30
  assert ltr["eval LTR acc"] == 0.2 and ltr["eval NSP acc"] is None


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


def test_single_run_and_missing_metric_columns(tmp_path):
  _write_run(str(tmp_path), "only", _config(True, True, False), [
    {"step": 5, "split": "train", "mlm_loss": 9.0, "nsp_loss": 0.5},
  ])  # fmt: skip
  header, rows = report.table(report.find_runs(str(tmp_path)))
  assert header[:3] == ["run", "steps", "train loss"]  # nothing ablated
  assert rows[0][:3] == ["only", 5, 9.5]
  md = report.markdown(header, rows)
  assert md.splitlines()[0] == "| run | steps | train loss |"  # empty eval columns dropped


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such directory"):
    report.find_runs(str(tmp_path / "absent"))
  with pytest.raises(ValueError, match="no run"):
    report.find_runs(str(tmp_path))
  bad = tmp_path / "r"
  bad.mkdir()
  (bad / "metrics.jsonl").write_text('{"step": 1, "split": "train"}\nnot json\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics row"):
    report.find_runs(str(tmp_path))


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
    "import sys; sys.modules['matplotlib'] = None; from bert_jax import report; "
    f"sys.argv = ['report', '--root={sweep_root}']; report.run()"
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
