"""bert_jax.report.claims: the paper's claims as Welch lines over pretraining runs, Holm-corrected;
masking, whole-word and BiLSTM claims."""

import os

from bert_jax import report
from unit._report_runs import T5, _config, _seeded_root, _write_results


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
