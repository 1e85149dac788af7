"""The paper's claims as lines of two compared points' per-pretraining-seed values, for
bert_jax/report/stats.py to judge: a line per (claim, task)."""

from __future__ import annotations

from typing import Any

from bert_jax.report import published, stats
from bert_jax.report.tables import Arm, Column, param_count

# The no-pretraining control's rows (experiments/_downstream.py: control): the same suite
# fine-tuned from random initialisations of the baseline's architecture, one row per baseline
# seed (`pretraining=none,seed=S`), grouped as one compared point.
CONTROL = "pretraining=none"


def _pairs(
  columns: list[Column],
  role: dict[Any, Arm],
  pairs: tuple[tuple[Any, Any, str], ...],
  claim: str = stats.BETTER,
  only: str | None = None,
) -> list[stats.Line]:
  """A line per task column (or the `only` paper column) for each (a, b) pair of roles
  present: the paper says a is better than b (or `claim`)."""
  lines = []
  for better, worse, text in pairs:
    if better not in role or worse not in role:
      continue
    a, b = role[better], role[worse]
    for c in columns:
      if only and published.COLUMNS.get(c.task) != only:
        continue
      if a.values(c.task) and b.values(c.task):
        where = f"{c.header} ({a.name} vs {b.name})"
        about = (text, c.header, f"{a.name} vs {b.name}")
        values = a.values(c.task), b.values(c.task)
        lines.append(stats.Line(f"{text}, {where}", *values, claim, about))
  return lines


def _objective(a: Arm) -> str | None:
  """Table 5's row of a point, from its pretraining config."""
  mlm, nsp, ltr = (a.config.get(f"objective.{k}") for k in ("mlm", "nsp", "ltr"))
  if ltr and not mlm:
    return "ltr"
  if mlm and not ltr:
    return "mlm_nsp" if nsp else "mlm"
  return None


def control_lines(columns: list[Column], arms: list[Arm]) -> list[stats.Line]:
  """Per task: each pretrained point against the no-pretraining control."""
  control = next((a for a in arms if a.name == CONTROL), None)
  if control is None:
    return []
  lines = []
  for c in columns:
    base = control.values(c.task)
    if not base:
      continue
    for a in arms:
      if a is not control and a.values(c.task):
        premise = "pretraining beats no pretraining (BERT's premise)"
        text = f"{premise}, {c.header} ({a.name})"
        about = (premise, c.header, f"{a.name} vs {CONTROL}")
        lines.append(stats.Line(text, a.values(c.task), base, stats.BETTER, about))
  return lines


def _table6(columns: list[Column], arms: list[Arm]) -> list[stats.Line]:
  with_size = [(n, a) for a in arms if (n := param_count(a.config)) is not None]
  sized = [a for _, a in sorted(with_size, key=lambda t: t[0])]
  if len(sized) < 2:
    return []
  lines = []
  small, large = sized[0], sized[-1]
  # Held-out MLM perplexity falls with size: every step up, and the largest against the smallest.
  steps = list(zip(sized, sized[1:], strict=False))
  if len(sized) > 2:
    steps.append((small, large))
  for lo, hi in steps:
    if lo.lm("mlm_perplexity") and hi.lm("mlm_perplexity"):
      claim = "held-out MLM perplexity falls with size"
      about = (claim, "held-out MLM perplexity", f"{hi.name} vs {lo.name}")
      ppl = hi.lm("mlm_perplexity"), lo.lm("mlm_perplexity")
      lines.append(stats.Line(f"{claim} ({hi.name} vs {lo.name})", *ppl, stats.LOWER, about))
  for c in columns:
    if large.values(c.task) and small.values(c.task):
      text = f"bigger is better, {c.header} (largest {large.name} vs smallest {small.name})"
      about = ("bigger is better", c.header, f"{large.name} vs {small.name}")
      values = large.values(c.task), small.values(c.task)
      lines.append(stats.Line(text, *values, stats.BETTER, about))
  return lines


def claim_lines(paper: str | None, columns: list[Column], arms: list[Arm]) -> list[stats.Line]:
  """The report's lines, unjudged: the control's, then the paper's claims."""
  lines = control_lines(columns, arms)
  arms = [a for a in arms if a.name != CONTROL]
  if paper == "table5":
    role = {_objective(a): a for a in arms if _objective(a)}
    # The "+ BiLSTM" row has no pretraining of its own: found by its name.
    role.update(("ltr_bilstm", a) for a in arms if "bilstm" in a.name)
    lines += _pairs(
      columns,
      role,
      (
        ("mlm", "ltr", "No NSP (MLM) beats LTR & No NSP (the bidirectional LM matters)"),
        ("mlm_nsp", "mlm", "BERT-Base (MLM + NSP) beats No NSP (NSP helps)"),
      ),
    )
    lines += _pairs(
      columns,
      role,
      (("ltr_bilstm", "ltr", "a BiLSTM on the LTR model improves SQuAD"),),
      only="SQuAD",
    )
  elif paper == "masking":
    role = {a.config.get("masking.mode"): a for a in arms if a.points[0].pretrain}
    text = "dynamic masking is comparable to or better than static"
    lines += _pairs(columns, role, (("dynamic", "static", text),), stats.COMPARABLE_OR_BETTER)
  elif paper == "wwm":
    role = {bool(a.config.get("masking.whole_word")): a for a in arms if a.points[0].pretrain}
    text = "whole-word masking beats masking WordPieces independently"
    lines += _pairs(columns, role, ((True, False, text),))
  elif paper == "table6":
    lines += _table6(columns, arms)
  return lines
