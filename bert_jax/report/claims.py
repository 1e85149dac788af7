"""The paper's claims, judged against the seed spread: a line per (claim, task)."""

from __future__ import annotations

import functools
from typing import Any

from bert_jax.report import published
from bert_jax.report.tables import Column, Point, param_count


def verdict(better: dict[str, float], worse: dict[str, float], comparable: bool = False) -> str:
  """Whether `better` beats `worse` by more than the seed spread (the larger of the stds); with
  `comparable`, whether it is at least as good up to the spread ("comparable or better": not
  reproduced only when worse by more than the spread)."""
  diff = better["mean"] - worse["mean"]
  spread = max(better["std"], worse["std"])
  n = f"n = {better['n']}/{worse['n']}"
  if min(better["n"], worse["n"]) < 2:
    return f"inconclusive: difference {diff:+.1f}, one seed ({n}): no spread to judge it by"
  if comparable:
    word = "not reproduced" if diff < -spread else "reproduced"
  else:
    word = "reproduced" if diff > spread else "not reproduced" if diff < -spread else "inconclusive"
  return f"{word}: difference {diff:+.1f}, seed spread {spread:.1f} ({n})"


def _pairwise(
  columns: list[Column],
  role: dict[Any, Point],
  pairs: tuple[tuple[Any, Any, str], ...],
  judge: Any = verdict,
  only: str | None = None,
) -> list[str]:
  """A claim line per task column (or the `only` paper column) for each (better, worse) pair
  of roles present."""
  lines = []
  for better, worse, text in pairs:
    if better not in role or worse not in role:
      continue
    a, b = role[better], role[worse]
    for c in columns:
      if only and published.COLUMNS.get(c.task) != only:
        continue
      if c.task in a.cells and c.task in b.cells:
        where = f"{c.header} ({a.name} vs {b.name})"
        lines.append(f"{text}, {where}: {judge(a.cells[c.task], b.cells[c.task])}")
  return lines


def _objective(p: Point) -> str | None:
  """Table 5's row of a point, from its pretraining config."""
  mlm, nsp, ltr = (p.config.get(f"objective.{k}") for k in ("mlm", "nsp", "ltr"))
  if ltr and not mlm:
    return "ltr"
  if mlm and not ltr:
    return "mlm_nsp" if nsp else "mlm"
  return None


# The no-pretraining control's row (experiments/_downstream.py): the same suite fine-tuned
# from a random initialisation of the baseline's architecture.
CONTROL = "pretraining=none"


def control_lines(columns: list[Column], points: list[Point]) -> list[str]:
  """Per task: each pretrained point against the no-pretraining control, by the seed spread."""
  control = next((p for p in points if p.name == CONTROL), None)
  if control is None:
    return []
  lines = []
  for c in columns:
    if c.task not in control.cells:
      continue
    base = control.cells[c.task]
    judged = [
      f"{p.name} {verdict(p.cells[c.task], base)}"
      for p in points
      if p is not control and c.task in p.cells
    ]
    if judged:
      lines.append(
        f"pretraining beats no pretraining (BERT's premise) on {c.header}, against "
        f"{CONTROL} ({base['mean']:.1f} ± {base['std']:.1f}): " + "; ".join(judged)
      )
  return lines


def claims(paper: str, columns: list[Column], points: list[Point]) -> list[str]:
  """One line per (claim, task): the paper's claim and its verdict on our numbers."""
  lines = control_lines(columns, points)
  points = [p for p in points if p.name != CONTROL]
  if paper == "table5":
    role = {_objective(p): p for p in points if _objective(p)}
    # The "+ BiLSTM" row has no pretraining of its own: found by its name.
    role.update(("ltr_bilstm", p) for p in points if "bilstm" in p.name)
    lines += _pairwise(
      columns,
      role,
      (
        ("mlm", "ltr", "No NSP (MLM) beats LTR & No NSP (the bidirectional LM matters)"),
        ("mlm_nsp", "mlm", "BERT-Base (MLM + NSP) beats No NSP (NSP helps)"),
      ),
    )
    lines += _pairwise(
      columns,
      role,
      (("ltr_bilstm", "ltr", "a BiLSTM on the LTR model improves SQuAD"),),
      only="SQuAD",
    )
  elif paper == "masking":
    role = {p.config.get("masking.mode"): p for p in points}
    text = "dynamic masking is comparable to or better than static"
    judge = functools.partial(verdict, comparable=True)
    lines += _pairwise(columns, role, (("dynamic", "static", text),), judge=judge)
  elif paper == "wwm":
    role = {bool(p.config.get("masking.whole_word")): p for p in points if p.pretrain}
    text = "whole-word masking beats masking WordPieces independently"
    lines += _pairwise(columns, role, ((True, False, text),))
  elif paper == "table6":
    with_size = [(n, p) for p in points if (n := param_count(p.config)) is not None]
    sized = [p for _, p in sorted(with_size, key=lambda t: t[0])]
    if len(sized) < 2:
      return lines
    ppl = [p.pretrain.last("eval").get("mlm_perplexity") if p.pretrain else None for p in sized]
    if all(v is not None for v in ppl):
      falls = all(b < a for a, b in zip(ppl, ppl[1:], strict=False))
      values = (" > " if falls else ", ").join(f"{v:.2f}" for v in ppl)
      lines.append(
        "held-out MLM perplexity falls monotonically with size: "
        + ("reproduced" if falls else "not reproduced")
        + f" ({values}, smallest model first; one pretraining run per size: no seed spread)"
      )
    for c in columns:
      have = [p for p in sized if c.task in p.cells]
      if len(have) < 2:
        continue
      cells = [p.cells[c.task] for p in have]
      # Monotone within the spread: no step down beyond its pair's spread, and the largest
      # model beats the smallest by more than theirs.
      head = verdict(cells[-1], cells[0])
      dips = [
        f"{have[i].name} -> {have[i + 1].name}"
        for i in range(len(cells) - 1)
        if cells[i + 1]["mean"] < cells[i]["mean"] - max(cells[i]["std"], cells[i + 1]["std"])
      ]
      if dips and head.startswith("reproduced"):
        head = "inconclusive" + head[len("reproduced") :]
      means = ", ".join(f"{x['mean']:.1f}" for x in cells)
      extra = f"; drops beyond the spread at {', '.join(dips)}" if dips else ""
      lines.append(
        f"bigger is better on {c.header} (largest vs smallest; means by size {means}{extra}): "
        + head
      )
  return lines
