"""bert_jax.report.tables: the pretraining table (ablated fields, final values, empty columns), the
fine-tuning table pooled over pretraining seeds, sizes and parameter counts."""

import os

import pytest

from bert_jax import report
from bert_jax.report import runs as runs_lib
from bert_jax.report import tables
from unit import _report_runs
from unit._report_runs import T5, _config, _seeded_root, _size_config, _write_run

# Shared fixtures (tests/unit/_report_runs.py).
sweep_root = _report_runs.sweep_root


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


def test_an_unread_corpus_path_is_not_an_ablation(tmp_path):
  # Runs that read built data (data.dir) from two checkouts: data.input (never read) differs.
  for name, checkout in (("task=mlm", "/a"), ("task=mlm_nsp", "/b")):
    config = _config(True, name.endswith("nsp"), False)
    config["data"] = {"dir": "/data/nsp", "input": f"{checkout}/bert_jax/data/sample.txt"}
    _write_run(str(tmp_path), name, config, [{"step": 5, "split": "train", "mlm_loss": 9.0}])
  runs = runs_lib.find_runs(str(tmp_path))
  assert tables.ablated_fields(runs) == ["objective.nsp"]
  for r in runs:  # without data.dir the corpus is what the run read: an ablation
    del r.config["data.dir"]
  assert tables.ablated_fields(runs) == ["objective.nsp", "data.input"]


def test_single_run_and_missing_metric_columns(tmp_path):
  _write_run(str(tmp_path), "only", _config(True, True, False), [
    {"step": 5, "split": "train", "mlm_loss": 9.0, "nsp_loss": 0.5},
  ])  # fmt: skip
  header, rows = tables.table(runs_lib.find_runs(str(tmp_path)))
  assert header[:4] == ["run", "steps", "tokens (M)", "train loss"]  # nothing ablated
  assert rows[0][:4] == ["only", 5, None, 9.5]  # no batch size in its config: no token count
  md = tables.markdown(header, rows)
  assert md.splitlines()[0] == "| run | steps | train loss |"  # empty eval columns dropped


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
