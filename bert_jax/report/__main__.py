r"""Paper-style results tables and plots for a directory of runs (e.g. a sweep's --root).

  python -m bert_jax.report --root=/tmp/table5 [--paper=table5|table6|masking|wwm] \
      [--split=test|dev] [--verdicts]

Pretraining: every directory under --root holding a `metrics.jsonl` (written by train.py) is a
run; its `config.json` says what it was. The table has one row per run: the config fields
that differ between the runs (the ablated ones), the steps trained, the final train loss (LM
loss + NSP loss, as the trainer prints it), and the last eval's MLM/LTR accuracy and
perplexity and NSP accuracy.

Fine-tuning: every `results.json` (written by bert_jax.finetune) is a fine-tuning run, laid
out as `<root>/<point>/finetune/<task>/results.json` (a sweep: <point> is the pretraining
run's workdir) or given directly (--root = a fine-tuning workdir, or a directory of them: the
point is then the checkpoint the run started from, its `init`). Points that differ only in
their pretraining seed (`...,seed=S`) are one compared point. The table is the paper's layout:
one row per compared point (its ablated fields, its held-out MLM perplexity and accuracy), one
column per task with "mean ± sd (pretraining runs x fine-tuning seeds)" x 100 on --split (per
pretraining run the mean of its fine-tuning seeds, at the lr chosen on dev), then a row per
trivial baseline (baselines.py). `--paper` adds published rows under ours (Devlin et al.
2019's Table 5 or 6; RoBERTa's static/dynamic masking; the BERT repository's whole-word
masking) and a line per claim, judged by stats.py (a 95% Welch interval over pretraining runs,
Holm-corrected over the report's lines); published.COLUMNS says which paper column each of
our stand-in tasks fills. `--verdicts` judges every experiment's claims together
(verdicts.py).

The tables are printed as markdown and written, with plots (loss curves; per-task bars with
std error bars; score vs model size when the points differ in size), to --root/report/. The
plots need matplotlib (`pip install 'bert_jax[plots]'`); without it the tables are still
written and the command says the plots were skipped.
"""

from __future__ import annotations

import os

from absl import flags

from bert_jax import cli
from bert_jax.report import REPORT_DIR, published, report

_ROOT = flags.DEFINE_string("root", None, "Directory holding the runs (e.g. a sweep root).")
_PAPER = flags.DEFINE_enum(
  "paper", None, list(published.TABLES), "Add the paper's published rows of this table."
)
_SPLIT = flags.DEFINE_enum(
  "split",
  "test",
  ["test", "dev"],
  "Fine-tuning split shown (test: measured at the best dev point).",
)
_VERDICTS = flags.DEFINE_bool(
  "verdicts",
  False,
  "--root holds one sweep root per experiment (table5, table6, masking, wwm): write the "
  "verdicts across them (report/verdicts.md).",
)
flags.mark_flags_as_required(["root"])


def main(argv: list[str]) -> None:
  del argv
  if _VERDICTS.value:
    from bert_jax.report import verdicts

    print(verdicts.summary(_ROOT.value, _SPLIT.value))
    print(f"\nwritten: {os.path.join(_ROOT.value, REPORT_DIR, verdicts.VERDICTS)}")
    return
  md, skipped = report(_ROOT.value, _PAPER.value, _SPLIT.value)
  print(md)
  out_dir = os.path.join(_ROOT.value, REPORT_DIR)
  if skipped:
    print(f"\nwritten: {out_dir}/results.md (plots skipped: {skipped})")
  else:
    print(f"\nwritten: {out_dir}/{{results.md,*.png}}")


def run() -> None:
  cli.run(main, "report")


if __name__ == "__main__":
  run()
