"""bert_jax.report on synthetic runs: table values, ablated columns, plots, errors."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax import report
from bert_jax.report import runs as runs_lib
from bert_jax.report import tables


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
  runs = runs_lib.find_runs(sweep_root)
  assert [r.name for r in runs] == ["task=ltr", "task=mlm_nsp"]
  header, rows = tables.table(runs)
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
  header, rows = tables.table(runs_lib.find_runs(str(tmp_path)))
  assert header[:4] == ["run", "steps", "tokens (M)", "train loss"]  # nothing ablated
  assert rows[0][:4] == ["only", 5, None, 9.5]  # no batch size in its config: no token count
  md = tables.markdown(header, rows)
  assert md.splitlines()[0] == "| run | steps | train loss |"  # empty eval columns dropped


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


def _summary(values):
  n = len(values)
  mean = sum(values) / n
  std = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0
  return {"mean": mean, "std": std, "median": sorted(values)[n // 2], "n": n,
          "min": min(values), "max": max(values)}  # fmt: skip


def _write_results(d, task, kind, metric, test, dev=None, summaries=True, init="/ckpt"):
  """A results.json with one seed per value of `test` (and `dev`, default test - 0.01)."""
  dev = dev or [v - 0.01 for v in test]
  os.makedirs(os.path.join(d, "seed_0"), exist_ok=True)
  # A fine-tuning seed logs like a trainer: it must not show up as a pretraining run.
  with open(os.path.join(d, "seed_0", "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 1, "split": "train", "loss": 0.5}) + "\n")
  res = {
    "task": task,
    "kind": kind,
    "init": init,
    "main_metric": metric,
    "seeds": [
      {"seed": i, "dev": {metric: dv}, "test": {metric: tv}}
      for i, (dv, tv) in enumerate(zip(dev, test, strict=True))
    ],
  }
  if summaries:
    res["dev"] = {metric: _summary(dev)}
    res["test"] = {metric: _summary(test)}
  with open(os.path.join(d, "results.json"), "w") as f:
    json.dump(res, f)


@pytest.fixture
def finetune_root(sweep_root):
  ft = lambda point, task: os.path.join(sweep_root, point, "finetune", task)
  rt = [0.838, 0.841, 0.844, 0.839, 0.843]  # mean 0.841, std sqrt(26e-6 / 4) = 0.00255
  _write_results(ft("task=mlm_nsp", "rotten_tomatoes"), "rotten_tomatoes", "classification",
                 "accuracy", rt)  # fmt: skip
  # No summaries in the file: the report computes them from the seeds.
  _write_results(ft("task=mlm_nsp", "vitaminc"), "vitaminc", "classification", "accuracy",
                 [0.59, 0.60, 0.61], summaries=False)  # fmt: skip
  # SQuAD's official F1 is in percent already: shown as is, not x 100.
  _write_results(ft("task=mlm_nsp", "squadshifts"), "squadshifts", "span_qa", "f1",
                 [40.0, 42.0, 44.0], dev=[50.0, 51.0, 52.0])  # fmt: skip
  _write_results(ft("task=ltr", "rotten_tomatoes"), "rotten_tomatoes", "classification",
                 "accuracy", [0.70, 0.72, 0.74])  # fmt: skip
  _write_results(ft("task=ltr", "vitaminc"), "vitaminc", "classification", "accuracy", [0.5])
  return sweep_root


def _seeded_root(tmp_path, points, task="rotten_tomatoes", baseline=None):
  """{point: (config, ppl, [[ft values] per pretraining seed])}: a sweep of seeded points."""
  root = str(tmp_path)
  for name, (config, ppl, per_seed) in points.items():
    for seed, values in enumerate(per_seed):
      point = f"{name},seed={seed}"
      if config is not None:
        _write_run(root, point, {**config, "seed": seed}, [
          {"step": 20, "split": "eval", "mlm_perplexity": ppl[seed], "mlm_accuracy": 0.3},
        ])  # fmt: skip
      d = os.path.join(root, point, "finetune", task)
      _write_results(d, task, "classification", "accuracy", values, init="")
      if baseline:
        with open(os.path.join(d, "results.json")) as f:
          res = json.load(f)
        res["baseline"] = {"name": "majority class", "test": {"accuracy": baseline}}
        with open(os.path.join(d, "results.json"), "w") as f:
          json.dump(res, f)
  return root


T5 = {
  "task=mlm_nsp": (_config(True, True, False), [40.0, 42.0, 41.0],
                   [[0.80, 0.82], [0.81, 0.81], [0.79, 0.80]]),
  "task=mlm": (_config(True, False, False), [39.0, 41.0, 40.0],
               [[0.70, 0.72], [0.71, 0.71], [0.69, 0.70]]),
  "task=ltr": (_config(False, False, True), [0.0] * 3, [[0.60, 0.61]]),  # one pretraining run
  "pretraining=none": (None, None, [[0.50, 0.52], [0.51, 0.53], [0.52, 0.50]]),
}  # fmt: skip


def test_finetune_table_pools_the_pretraining_seeds(tmp_path):
  root = _seeded_root(tmp_path, T5, baseline=0.508)
  runs = runs_lib.find_runs(root)
  ft = runs_lib.find_finetune_runs(root)
  assert len(ft) == 10 and "task=mlm,seed=2" in {r.name for r in runs}
  header, rows = tables.finetune_table(runs, ft, baselines={"rotten_tomatoes": {"lookup": 1.0}})
  assert header == [
    "point", "objective.mlm", "objective.nsp", "objective.ltr", "MLM ppl", "MLM acc %",
    "rotten_tomatoes (SST-2) accuracy",
  ]  # fmt: skip
  by = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
  # Per pretraining seed the mean of its 2 fine-tuning seeds (81, 81, 79.5), then their mean
  # and sd over the 3 pretraining runs: 80.5 ± 0.87.
  assert by["task=mlm_nsp"]["rotten_tomatoes (SST-2) accuracy"] == "80.5 ± 0.9 (3 x 2)"
  assert by["task=mlm_nsp"]["MLM ppl"] == "41.00 ± 1.00"
  assert by["task=ltr"]["rotten_tomatoes (SST-2) accuracy"] == "60.5 ± 0.0 (1 x 2)"
  assert by["pretraining=none"]["rotten_tomatoes (SST-2) accuracy"] == "51.3 ± 0.6 (3 x 2)"
  assert by["baseline: lookup"]["rotten_tomatoes (SST-2) accuracy"] == "1.0"
  md, _ = report.report(root, paper="table5")
  assert "| baseline: majority class | – | – | – | – | – | 50.8 |" in md


def test_claims_are_welch_intervals_over_pretraining_runs_holm_corrected(tmp_path):
  from bert_jax.report import stats

  root = _seeded_root(tmp_path, T5)
  md, _ = report.report(root, paper="table5")
  part = md.split("### The paper's claims at this scale (test; ")[1]
  assert stats.TEST in part
  lines = [ln for ln in part.splitlines() if ln.startswith("- ")]
  assert len(lines) == 3 + 2  # the control against 3 points, then mlm vs ltr and NSP helps
  got = {ln.split(": ", 1)[0]: ln.split(": ", 1)[1] for ln in lines}
  nsp = got["- BERT-Base (MLM + NSP) beats No NSP (NSP helps), rotten_tomatoes (SST-2) accuracy"
             " (task=mlm_nsp vs task=mlm)"]  # fmt: skip
  a, b = [81.0, 81.0, 79.5], [71.0, 71.0, 69.5]
  c = stats.welch(a, b)
  assert nsp.startswith(f"reproduced: difference +10.0 [{c.low:+.1f}, {c.high:+.1f}] (3 vs 3 ")
  # LTR has one pretraining run: never a verdict.
  ltr = got["- No NSP (MLM) beats LTR & No NSP (the bidirectional LM matters), rotten_tomatoes "
            "(SST-2) accuracy (task=mlm vs task=ltr)"]  # fmt: skip
  assert (
    ltr == "inconclusive (one pretraining run): difference +10.0 (3 vs 1 pretraining runs: "
    "no interval)"
  )
  premise = "- pretraining beats no pretraining (BERT's premise), rotten_tomatoes (SST-2) accuracy"
  assert got[f"{premise} (task=mlm)"].startswith("reproduced: difference +19.2 [")
  # Holm over the 3 lines with a p-value (not LTR's): the smallest raw p is multiplied by 3.
  family = [stats.welch(a, b).p] + [
    stats.welch(x, [51.0, 52.0, 51.0]).p for x in (a, b)
  ]  # fmt: skip
  assert f"Holm p = {3 * min(family):.3g})" in md


def test_size_sweep_sorted_by_size_with_table6(tmp_path):
  sizes = {
    "row=small": (_size_config(1, 32), [60.0, 62.0, 61.0], [[0.70, 0.70]] * 3),
    "row=big": (_size_config(4, 64), [30.0, 31.0, 32.0], [[0.80, 0.82], [0.81, 0.81], [0.8, 0.8]]),
  }  # fmt: skip
  root = _seeded_root(tmp_path, sizes)
  md, skipped = report.report(root, paper="table6")
  assert skipped is None
  fine = md.split("## Fine-tuning")[1]
  rows = [ln for ln in fine.splitlines() if ln.startswith("| row=") or ln.startswith("| paper")]
  # Smallest model first (as Table 6), whatever the names sort to; then the paper's rows.
  assert rows[0].startswith(
    "| row=small | 1 | 32 | 128 | 61.00 ± 1.00 | 30.0 ± 0.0 | 70.0 ± 0.0 (3 x 2) |"
  )
  assert rows[1].startswith(
    "| row=big | 4 | 64 | 256 | 31.00 ± 1.00 | 30.0 ± 0.0 | 80.7 ± 0.6 (3 x 2) |"
  )
  assert rows[2] == "| paper: L=3 H=768 A=12 | 3 | 768 | – | 5.84 | – | 88.4 | 77.9 | 79.8 |"
  claims_ = [ln for ln in md.splitlines() if ln.startswith("- ")]
  assert claims_[0].startswith(
    "- held-out MLM perplexity falls with size (row=big vs row=small): reproduced: difference "
    "-30.0 ["
  )
  assert claims_[1].startswith(
    "- bigger is better, rotten_tomatoes (SST-2) accuracy (largest row=big vs smallest "
    "row=small): reproduced: difference +10.7 ["
  )
  assert tables.param_count(runs_lib.config_fields(_size_config(1, 32))) == (
    (100 + 512 + 2) * 32 + 2 * 32 + 4 * (32 * 32 + 32) + 4 * 32 + 2 * (32 * 128) + 128 + 32
    + 32 * 32 + 32
  )  # fmt: skip
  bert_base = {"model.vocab_size": 30522, "model.hidden_size": 768, "model.num_layers": 12,
               "model.intermediate_size": 3072}  # fmt: skip
  assert tables.param_count(bert_base) == 109_482_240  # transformers' BertModel(bert-base)
  with open(os.path.join(root, "report", "finetune_vs_size.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(os.path.join(root, "report", "finetune_tasks.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _size_config(layers, hidden):
  return {"model": {"num_layers": layers, "hidden_size": hidden, "num_heads": 2,
                    "intermediate_size": 4 * hidden, "vocab_size": 100}}  # fmt: skip


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


def test_masking_wwm_and_bilstm_claims(tmp_path):
  def masking(mode, whole_word=False):
    cfg = _config(True, True, False)
    cfg["masking"] = {"mode": mode, "whole_word": whole_word}
    return cfg

  ppl = [40.0, 41.0, 42.0]
  root = _seeded_root(tmp_path / "m", {
    "mode=static": (masking("static"), ppl, [[0.80, 0.80], [0.81, 0.81], [0.82, 0.82]]),
    "mode=dynamic": (masking("dynamic"), ppl, [[0.806, 0.806], [0.811, 0.811], [0.816, 0.816]]),
  })  # fmt: skip
  md, _ = report.report(root, paper="masking")
  assert "RoBERTa) Table 1" in md and "| paper: dynamic (RoBERTa Table 1; SQuAD 2.0) |" in md
  # +0.1 with sd 1.0 a side: its 90% interval's low end is above -1 only with far more runs.
  assert (
    "- dynamic masking is comparable to or better than static, rotten_tomatoes (SST-2) accuracy"
    " (mode=dynamic vs mode=static): inconclusive: difference +0.1 ["
  ) in md
  root = _seeded_root(tmp_path / "m2", {
    "mode=static": (masking("static"), ppl, [[0.80, 0.80], [0.801, 0.801], [0.802, 0.802]]),
    "mode=dynamic": (masking("dynamic"), ppl, [[0.801, 0.801], [0.802, 0.802], [0.803, 0.803]]),
  })  # fmt: skip
  md, _ = report.report(root, paper="masking")
  assert "(mode=dynamic vs mode=static): comparable or better: difference +0.1 [" in md
  wwm = _seeded_root(tmp_path / "w", {
    "whole_word=False": (masking("static"), ppl, [[0.80, 0.80], [0.81, 0.81], [0.82, 0.82]]),
    "whole_word=True": (masking("static", True), ppl, [[0.70, 0.70], [0.71, 0.71], [0.72, 0.72]]),
  })  # fmt: skip
  md, _ = report.report(wwm, paper="wwm")
  assert (
    "whole-word masking beats masking WordPieces independently, rotten_tomatoes (SST-2) "
    "accuracy (whole_word=True vs whole_word=False): contradicted: difference -10.0 ["
  ) in md


def test_bilstm_claim_is_squad_only(tmp_path):
  root = _seeded_root(tmp_path, {"task=ltr": T5["task=ltr"]})
  for point, vals in (("task=ltr_bilstm,seed=0", [50.0, 52.0]), ("task=ltr,seed=0", [40.0, 41.0])):
    _write_results(os.path.join(root, point, "finetune", "squad_split"), "squad_split",
                   "span_qa", "f1", vals)  # fmt: skip
  _write_results(os.path.join(root, "task=ltr_bilstm,seed=0", "finetune", "rotten_tomatoes"),
                 "rotten_tomatoes", "classification", "accuracy", [0.5, 0.5])  # fmt: skip
  md, _ = report.report(root, paper="table5")
  lines = [ln for ln in md.splitlines() if "BiLSTM" in ln and ln.startswith("- ")]
  assert lines == [
    "- a BiLSTM on the LTR model improves SQuAD, squad_split (SQuAD) f1 (task=ltr_bilstm vs "
    "task=ltr): inconclusive (one pretraining run): difference +10.5 (1 vs 1 pretraining runs: "
    "no interval)"
  ]


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


def test_lexical_baselines_on_known_inputs():
  from bert_jax.report import baselines

  train = [(["the", "dog", "runs"], ["AT", "NN", "VBZ"]), (["the", "run"], ["AT", "NN"]),
           (["dog", "the"], ["VB", "AT"])]  # fmt: skip
  # 'dog' -> NN (1 vs 1: the first seen), 'the' -> AT; unseen 'cat' -> AT (the most frequent).
  test = [(["the", "dog", "cat"], ["AT", "NN", "NN"])]
  assert baselines.tag_lookup_accuracy(train, test) == pytest.approx(2 / 3)
  context = "The tower was finished in 1889. Gustave Eiffel built the tower. It is tall."
  qs = [("Who built the tower?", context, ["Gustave Eiffel"]),
        ("How tall is it?", context, ["tall"])]  # fmt: skip
  # Q1: sentence 2 shares 'built' and 'tower' (sentence 1 only 'tower'; articles are dropped):
  # "Gustave Eiffel built the tower." against "Gustave Eiffel": F1 = 2 * (2/4 * 1) / (2/4 + 1)
  # = 2/3; Q2: "It is tall." against "tall": 2 * (1/3 * 1) / (1/3 + 1) = 0.5. On a tie the
  # first sentence wins.
  assert baselines.overlap_sentence_f1(qs) == pytest.approx(100 * (2 / 3 + 0.5) / 2)
  tie = [("What was built?", "It was built. Gustave Eiffel built it.", ["Gustave Eiffel"])]
  assert baselines.overlap_sentence_f1(tie) == 0.0


def test_overlap_threshold_on_known_inputs(tmp_path):
  from bert_jax.report import baselines

  # Overlaps (the first text's words found in the second; articles would be dropped, so none
  # here): 0.75 E, 0.25 N, 1.0 E, 0.0 N, 0.5 N. Only t = 0.75 (E at or above) gets all 5 right.
  train = [("p q r s", "p q r z", "E"), ("p q r s", "p z y x", "N"), ("p q", "q p", "E"),
           ("p q", "z y", "N"), ("p q r s", "p q y x", "N")]  # fmt: skip
  # 0.75 -> E (right), 0.5 -> N (wrong), 0.0 -> N (right).
  test = [("p q r s", "s r q y", "E"), ("p q", "p z", "E"), ("p q r s", "z", "N")]
  assert baselines.overlap_threshold_accuracy(train, test) == pytest.approx(2 / 3)
  # The side is learned too: with the labels swapped, N at or above 0.75.
  swap = {"E": "N", "N": "E"}
  flip = lambda rows: [(a, b, swap[y]) for a, b, y in rows]
  assert baselines.overlap_threshold_accuracy(flip(train), flip(test)) == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="2 classes, not 3"):
    baselines.overlap_threshold_accuracy([*train, ("p", "p", "X")], test)
  # task_baselines reads a 2-class pair task's files as results.json's config names them.
  for split, rows in (("train", train), ("test", test)):
    lines = [json.dumps({"question": a, "sentence": b, "label": y}) for a, b, y in rows]
    (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
  task = {"train": str(tmp_path / "train.jsonl"), "test": str(tmp_path / "test.jsonl"),
          "text_fields": ["question", "sentence"], "label_field": "label",
          "max_train_examples": 0, "max_eval_examples": 2}  # fmt: skip
  results = {"kind": "classification", "main_metric": "accuracy", "labels": ["E", "N"],
             "baseline": {"name": "majority class", "test": {"accuracy": 0.5}},
             "config": {"task": task}}  # fmt: skip
  # The first 2 test rows: 0.75 -> E right, 0.5 -> N wrong.
  assert baselines.task_baselines(results, "test") == {
    "majority class": 50.0,
    "word-overlap threshold": 50.0,
  }
  one = {**results, "config": {"task": {**task, "text_fields": ["sentence"]}}}
  assert baselines.task_baselines(one, "test") == {"majority class": 50.0}


# ----------------------------------------------------------------------------- the test


def test_welch_interval_and_p_match_scipy_and_a_hand_computation():
  from scipy import stats as st

  from bert_jax.report import stats

  a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
  c = stats.welch(a, b)
  # By hand: means 2.5 and 4, variances 5/3 and 4, so se^2 = 5/12 + 4/3 = 1.75 and
  # df = 1.75^2 / ((5/12)^2 / 3 + (4/3)^2 / 2) = 3.2347.
  assert c.diff == pytest.approx(-1.5)
  assert c.df == pytest.approx(3.0625 / (25 / 432 + 8 / 9), rel=1e-9)
  t = st.t.ppf(0.975, c.df)
  assert (c.low, c.high) == pytest.approx((-1.5 - t * 1.75**0.5, -1.5 + t * 1.75**0.5))
  ref = st.ttest_ind(a, b, equal_var=False)
  ci = ref.confidence_interval(0.95)
  assert c.p == pytest.approx(ref.pvalue) and (c.low, c.high) == pytest.approx((ci.low, ci.high))
  assert 0.2 < c.p < 0.4  # 3 vs 4 runs 1.5 apart: not a difference at 5%
  one = stats.welch([5.0], [1.0, 2.0])  # one run: no interval
  assert one.diff == pytest.approx(3.5) and one.high == float("inf") and one.p != one.p


def test_holm_on_known_p_values():
  from bert_jax.report import stats

  # Sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone
  # 0.02, 0.03, 0.06, 0.06.
  assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
  nan = float("nan")
  out = stats.holm([0.02, nan, 0.04])  # nan is not in the family: m = 2
  assert out[0] == pytest.approx(0.04) and out[2] == pytest.approx(0.04) and out[1] != out[1]
  assert stats.holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])


def test_judge_verdicts():
  from bert_jax.report import stats

  clear = stats.Line("a beats b", [80.0, 81.0, 80.5], [70.0, 70.5, 71.0])
  wrong = stats.Line("b beats a", [70.0, 70.5, 71.0], [80.0, 81.0, 80.5])
  noisy = stats.Line("noisy", [50.0, 60.0, 55.0], [52.0, 58.0, 50.0])
  single = stats.Line("one run", [90.0], [70.0, 71.0, 70.5])
  ppl = stats.Line("perplexity falls", [40.0, 41.0, 40.5], [50.0, 51.0, 50.5], stats.LOWER)
  same = stats.Line("comparable", [76.0, 76.2, 76.1], [76.1, 76.0, 76.3], stats.COMPARABLE)
  worse = stats.Line(
    "comparable or better", [74.0, 74.2, 74.1], [76.1, 76.0, 76.3], stats.COMPARABLE_OR_BETTER
  )
  lines = stats.judge([clear, wrong, noisy, single, ppl, same, worse])
  assert [ln.verdict for ln in lines] == [
    "reproduced", "contradicted", "inconclusive", "inconclusive (one pretraining run)",
    "reproduced", "comparable", "inconclusive",
  ]  # fmt: skip
  # The family is the 6 lines with a p-value: Holm multiplies the smallest by 6.
  raw = [stats.welch(ln.a, ln.b).p for ln in (clear, wrong, ppl)]
  assert min(ln.p_adjusted for ln in (clear, wrong, ppl)) == pytest.approx(6 * min(raw))
  assert clear.describe().startswith("reproduced: difference +10.0 [+")
  assert "3 vs 3 pretraining runs, Holm p = " in clear.describe()
  assert single.describe() == (
    "inconclusive (one pretraining run): difference +19.5 (1 vs 3 pretraining runs: no interval)"
  )
  # A difference inside the spread of the runs is not reproduced however many lines there are.
  assert stats.judge([stats.Line("x", [1.0, 3.0, 2.0], [0.0, 2.0, 1.0])])[0].verdict == (
    "inconclusive"
  )


def test_verdicts_across_experiments_judge_every_line_once(tmp_path):
  from bert_jax.report import stats, verdicts

  _seeded_root(tmp_path / "table5", T5, baseline=0.508)
  # Table 6 shares Table 5's baseline and control (the same values): their lines come once.
  sizes = {
    "row=tiny": (_config(True, True, False), [40.0, 42.0, 41.0], T5["task=mlm_nsp"][2]),
    "row=L2_H256_A4": (
      {**_config(True, True, False), "model": {"num_layers": 2, "hidden_size": 256}},
      [30.0, 31.0, 32.0], [[0.9, 0.9], [0.91, 0.91], [0.92, 0.92]],
    ),
    "pretraining=none": T5["pretraining=none"],
  }  # fmt: skip
  for cfg in (sizes["row=tiny"][0], sizes["row=L2_H256_A4"][0]):
    cfg["model"].update(vocab_size=100, intermediate_size=4 * cfg["model"]["hidden_size"])
  _seeded_root(tmp_path / "table6", sizes)
  # Pretrained, not fine-tuned yet: listed as missing.
  _write_run(str(tmp_path / "table5"), "task=mlm,seed=3", _config(True, False, False),
             [{"step": 20, "split": "eval", "mlm_perplexity": 40.0}])  # fmt: skip
  md = verdicts.summary(str(tmp_path))
  assert md == open(tmp_path / "report" / "verdicts.md").read().strip()
  rows = [ln for ln in md.splitlines() if ln.startswith("| table")]
  premise = [r for r in rows if "BERT's premise" in r]
  # The control against mlm_nsp, mlm, ltr (table5) and the 256-wide row (table6): the tiny row's
  # line is table5's mlm_nsp line again.
  assert len(premise) == 4 and sum("row=L2_H256_A4 vs pretraining=none" in r for r in premise) == 1
  family = [r for r in rows if not r.split(" | ")[6].startswith("–")]
  assert f"{len(rows)} lines, Holm over all of them" in md and stats.TEST in md
  assert len(family) == len(rows) - 2  # the ltr lines: one pretraining run, no p-value
  size = next(r for r in rows if "bigger is better" in r)
  assert "| row=L2_H256_A4 vs row=tiny | 3 vs 3 | +10.5 [" in size and "**reproduced**" in size
  assert (
    "| rotten_tomatoes (SST-2) accuracy | majority class 50.8 | table6/row=L2_H256_A4: 91.0 "
    "| yes |" in md
  )
  assert "- table5: task=ltr fine-tuned for 1 of 3 pretraining runs" in md
  assert "- table5: task=mlm fine-tuned for 3 of 4 pretraining runs" in md
  with pytest.raises(ValueError, match="none of table5, table6, masking, wwm below it"):
    verdicts.summary(str(tmp_path / "table5"))
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.report", f"--root={tmp_path}", "--verdicts"],
    capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert r.returncode == 0 and r.stdout.startswith("## Verdicts (test split; "), r.stderr
