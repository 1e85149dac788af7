"""bert_jax.report.stats: Welch's interval and p against scipy and a hand computation, Holm, the
verdicts."""

import pytest


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
