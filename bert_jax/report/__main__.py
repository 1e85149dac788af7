"""`python -m bert_jax.report --root=DIR [--paper=...] [--split=test|dev] [--verdicts]` (see the
package docstring; --verdicts: bert_jax/report/verdicts.py)."""

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
