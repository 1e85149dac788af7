"""Writes tests/fixtures/squad/metric_cases.json: SQuAD EM/F1 expected from independent code.

v1.1 numbers come from torchmetrics' `squad` (the official evaluate-v1.1 algorithm), v2.0 numbers
and the best no-answer F1 from transformers' `squad_metrics` (the official evaluate-v2.0
algorithm), the answer-text alignment from its `get_final_text` (run_squad's). Neither package
is needed by the tests, only by this script:

  /work/venv-ref/bin/pip install torchmetrics   # next to torch + transformers
  /work/venv-ref/bin/python scripts/make_squad_fixtures.py
"""

import json
import os

from torchmetrics.functional.text import squad as tm_squad
from transformers.data.metrics import squad_metrics as hf

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "squad")

# (qid, references, prediction or None = unanswered). No case where both sides normalise to
# nothing: there torchmetrics scores F1 1 and evaluate-v1.1 scores 0 (checked by hand instead).
V1_CASES = [
  ("articles", ["Denver Broncos", "Denver Broncos", "the Denver Broncos"], "The Denver Broncos."),
  ("partial", ["Saint Bernadette Soubirous"], "Bernadette"),
  ("several_refs", ["an apple", "A pear!", "a green pear"], "pear"),
  ("accents", ["Ünïcode café"], "ünïcode cafe"),
  ("digits_punct", ["1,000 km"], "1000 km"),
  ("empty_pred", ["New York City"], ""),
  ("unanswered", ["Paris"], None),
  ("curly_quotes", ["“quoted” text", "naïve—approach"], "quoted text"),
  ("repeats", ["the the cat cat cat"], "cat dog cat"),
  ("cjk", ["東京 タワー"], "東京"),
  ("word_boundary", ["theology and anthems"], "Theology, an anthem"),
  ("hyphen", ["state-of-the-art model"], "state of the art model"),
  ("whitespace", ["  two\twords \n"], "two words"),
]

# (qid, references ([] = no answer), best non-null prediction, null-score diff), diffs distinct.
V2_CASES = [
  ("a1", ["Denver Broncos"], "Denver Broncos", -3.0),
  ("a2", ["in 1895", "1895"], "1895 and 1896", 0.5),
  ("a3", ["the river"], "mountain", 2.5),
  ("n1", [], "something", 1.5),
  ("n2", [], "nothing at all", -1.0),
  ("n3", [], "an answer", 4.0),
  ("a4", ["Marie Curie"], "Curie", 1.0),
  ("n4", ["", "the"], "whatever", 3.0),
]


def v1_expected():
  per_question = {}
  for qid, refs, pred in V1_CASES:
    if pred is None:
      per_question[qid] = {"exact_match": 0.0, "f1": 0.0}
      continue
    out = tm_squad(
      [{"prediction_text": pred, "id": qid}],
      [{"answers": {"answer_start": [0] * len(refs), "text": refs}, "id": qid}],
    )
    per_question[qid] = {k: float(v) for k, v in out.items()}
  total = tm_squad(
    [{"prediction_text": p, "id": q} for q, _, p in V1_CASES if p is not None]
    + [{"prediction_text": "Paris", "id": "not_in_gold"}],
    [{"answers": {"answer_start": [0] * len(r), "text": r}, "id": q} for q, r, _ in V1_CASES],
  )
  return per_question, {k: float(v) for k, v in total.items()}


def v2_expected():
  exact, f1, has_ans, preds, diffs = {}, {}, {}, {}, {}
  for qid, refs, pred, diff in V2_CASES:
    golds = [r for r in refs if hf.normalize_answer(r)] or [""]
    exact[qid] = max(hf.compute_exact(g, pred) for g in golds)
    f1[qid] = max(hf.compute_f1(g, pred) for g in golds)
    has_ans[qid] = bool([r for r in refs if hf.normalize_answer(r)])
    preds[qid], diffs[qid] = pred, diff
  best_f1, thresh = hf.find_best_thresh(preds, f1, diffs, has_ans)
  all_answered = hf.make_eval_dict(exact, f1)
  return {
    "exact": exact,
    "f1": f1,
    "no_null": {"exact_match": all_answered["exact"], "f1": all_answered["f1"]},
    "best_f1": best_f1,
    "hf_best_f1_thresh": thresh,
  }


# (prediction as detokenized WordPiece, original doc words): run_squad's get_final_text.
FINAL_TEXT_CASES = [
  ("1889", "(1889)"),
  ("eiffel ' s company", "Eiffel's company."),
  ("france", "France."),
  ("cafe", "Café,"),
  ("naive", "naïve"),
  ("smith", "Steve Smith's"),
  ("xyz", "abc"),
  ("10 %", "10%"),
]


def final_text_expected():
  return [[p, o, hf.get_final_text(p, o, do_lower_case=True)] for p, o in FINAL_TEXT_CASES]


def main():
  per_question, total = v1_expected()
  doc = {
    "v1": {
      "cases": [{"qid": q, "references": r, "prediction": p} for q, r, p in V1_CASES],
      "extra_prediction": {"not_in_gold": "Paris"},
      "per_question": per_question,
      "total": total,
    },
    "v2": {
      "cases": [{"qid": q, "references": r, "prediction": p, "diff": d} for q, r, p, d in V2_CASES],
      **v2_expected(),
    },
    "final_text": final_text_expected(),
  }
  os.makedirs(OUT, exist_ok=True)
  path = os.path.join(OUT, "metric_cases.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(doc, f, ensure_ascii=False, indent=1)
    f.write("\n")
  print(path)


if __name__ == "__main__":
  main()
