"""The test every verdict of the replication goes through, in one place.

The unit of variance is the pretraining run: a point's score on a task is, per pretraining
seed, the mean over that run's fine-tuning seeds (nested), and two points are compared on
those per-pretraining-seed means. TEST (below, printed in every report's header) says what is
computed; `judge` applies it to a report's lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.05
# "Comparable": the equivalence margin, in the reported unit (accuracy or F1 x 100, or
# perplexity). Two points are comparable when the 90% interval of their difference lies within
# +-MARGIN (two one-sided tests at 5%, TOST); "comparable or better" needs only its lower end
# above -MARGIN.
MARGIN = 1.0

TEST = (
  "Unit: the pretraining run (a point's per-task score is, per pretraining seed, the mean of "
  "its fine-tuning seeds). Each line compares two points' per-pretraining-seed means: their "
  "difference with a 95% Welch interval (Student t, Welch-Satterthwaite degrees of freedom). "
  "*reproduced*: the interval excludes 0 in the paper's direction and the line's two-sided "
  f"p-value stays below {ALPHA} after a Holm correction over the report's lines; *contradicted*: "
  "the same in the other direction; *comparable* (a claim of no difference, or of 'comparable "
  f"or better'): the 90% interval lies within ±{MARGIN:g} (or above -{MARGIN:g}), two one-sided "
  "tests, Holm-corrected likewise; *inconclusive*: otherwise, and always when a side has one "
  "pretraining run."
)


@dataclass(frozen=True)
class Comparison:
  """One claim line's numbers: a - b over pretraining seeds."""

  diff: float
  low: float  # the 95% interval
  high: float
  p: float  # two-sided Welch p-value (nan with fewer than 2 runs a side)
  df: float
  n_a: int
  n_b: int


def _mean_var(x: Sequence[float]) -> tuple[float, float]:
  n = len(x)
  mean = sum(x) / n
  var = sum((v - mean) ** 2 for v in x) / (n - 1) if n > 1 else math.nan
  return mean, var


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Comparison:
  """mean(a) - mean(b) with its `level` Welch interval and two-sided p-value. With fewer than
  2 values a side the interval is infinite and p is nan (no spread to judge by)."""
  from scipy import stats as st

  if not a or not b:
    raise ValueError("welch: each side needs at least one value")
  (ma, va), (mb, vb) = _mean_var(a), _mean_var(b)
  diff = ma - mb
  if len(a) < 2 or len(b) < 2:
    return Comparison(diff, -math.inf, math.inf, math.nan, math.nan, len(a), len(b))
  sa, sb = va / len(a), vb / len(b)
  se = math.sqrt(sa + sb)
  if se == 0:  # identical runs on both sides: a difference without spread
    p = 1.0 if diff == 0 else 0.0
    return Comparison(diff, diff, diff, p, math.inf, len(a), len(b))
  df = (sa + sb) ** 2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
  t = st.t.ppf(0.5 + level / 2, df)
  p = 2 * st.t.sf(abs(diff) / se, df)
  return Comparison(diff, diff - t * se, diff + t * se, float(p), df, len(a), len(b))


def tost_p(a: Sequence[float], b: Sequence[float], margin: float, lower_only: bool) -> float:
  """p-value of "|mean(a) - mean(b)| < margin" (two one-sided Welch tests; `lower_only`: of
  "mean(a) - mean(b) > -margin", non-inferiority). nan with fewer than 2 values a side."""
  from scipy import stats as st

  c = welch(a, b)
  if math.isnan(c.p):
    return math.nan
  (_, va), (_, vb) = _mean_var(a), _mean_var(b)
  se = math.sqrt(va / len(a) + vb / len(b))
  if se == 0:
    inside = c.diff > -margin and (lower_only or c.diff < margin)
    return 0.0 if inside else 1.0
  p_low = st.t.sf((c.diff + margin) / se, c.df)  # H0: diff <= -margin
  if lower_only:
    return float(p_low)
  p_high = st.t.cdf((c.diff - margin) / se, c.df)  # H0: diff >= margin
  return float(max(p_low, p_high))


def holm(pvalues: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values (nan stays nan and is not counted in the family)."""
  idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
  m = len(idx)
  out = [math.nan] * len(pvalues)
  running = 0.0
  for rank, i in enumerate(idx):
    running = max(running, min(1.0, (m - rank) * pvalues[i]))
    out[i] = running
  return out


# What a claim says of its two points (a: the one the paper says is better).
BETTER = "better"  # a beats b
COMPARABLE = "comparable"  # a and b within the margin of each other
COMPARABLE_OR_BETTER = "comparable or better"  # a is not worse than b by more than the margin
LOWER = "lower"  # a's value is lower (perplexity)


@dataclass
class Line:
  """A claim line of a report: its text, the two points' per-pretraining-seed values."""

  text: str
  a: list[float]
  b: list[float]
  claim: str = BETTER
  # What the line is about, for tables (the claim, the task column, the two points).
  about: tuple[str, str, str] = ("", "", "")
  comparison: Comparison | None = None
  p_adjusted: float = math.nan
  verdict: str = ""

  def describe(self) -> str:
    c = self.comparison
    n = f"{c.n_a} vs {c.n_b} pretraining runs"
    if math.isinf(c.high):
      return f"{self.verdict}: difference {c.diff:+.1f} ({n}: no interval)"
    holm_p = "" if math.isnan(self.p_adjusted) else f", Holm p = {self.p_adjusted:.3g}"
    return f"{self.verdict}: difference {self.interval()} ({n}{holm_p})"

  def interval(self) -> str:
    c = self.comparison
    if math.isinf(c.high):
      return f"{c.diff:+.1f}"
    return f"{c.diff:+.1f} [{c.low:+.1f}, {c.high:+.1f}]"


def judge(lines: list[Line], alpha: float = ALPHA, margin: float = MARGIN) -> list[Line]:
  """Sets every line's comparison, Holm-adjusted p-value and verdict (TEST), in place; the
  Holm family is `lines`."""
  tests = []
  for ln in lines:
    ln.comparison = welch(ln.a, ln.b)
    if ln.claim in (COMPARABLE, COMPARABLE_OR_BETTER):
      tests.append(tost_p(ln.a, ln.b, margin, lower_only=ln.claim == COMPARABLE_OR_BETTER))
    else:
      tests.append(ln.comparison.p)
  adjusted = holm(tests)
  for ln, p in zip(lines, adjusted, strict=True):
    ln.p_adjusted = p
    c = ln.comparison
    if math.isnan(p):
      ln.verdict = "inconclusive (one pretraining run)"
    elif ln.claim in (COMPARABLE, COMPARABLE_OR_BETTER):
      ln.verdict = ln.claim if p < alpha else "inconclusive"
    else:
      sign = -1 if ln.claim == LOWER else 1
      if p >= alpha:
        ln.verdict = "inconclusive"
      else:
        ln.verdict = "reproduced" if sign * c.diff > 0 else "contradicted"
  return lines
