"""Writes tests/fixtures/squad/: a tiny SQuAD file and what independent code makes of it.

tiny_v1.json: synthetic SQuAD v1.1 data (some offsets wrong on purpose, for re-anchoring).
hf_windows.json: transformers' `squad_convert_examples_to_features` (run_squad's windows) on
the examples of tiny_v1.json whose offsets are right.
metric_cases.json: v1.1 EM/F1 from torchmetrics' `squad` (the official evaluate-v1.1
algorithm); v2.0 EM/F1 and the best no-answer F1 from transformers' `squad_metrics` (the
official evaluate-v2.0 algorithm); the answer-text alignment from its `get_final_text`
(run_squad's). The tests need none of these packages, only this script does:

  /work/venv-ref/bin/pip install torchmetrics   # next to torch + transformers
  /work/venv-ref/bin/python scripts/make_squad_fixtures.py
"""

import json
import os

from torchmetrics.functional.text import squad as tm_squad
from transformers.data.metrics import squad_metrics as hf

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "squad")


def _qa(qid, question, answers, is_impossible=None):
  qa = {
    "id": qid,
    "question": question,
    "answers": [{"text": t, "answer_start": s} for t, s in answers],
  }
  if is_impossible is not None:
    qa["is_impossible"] = is_impossible
  return qa


CONTEXT_A = (
  "The Eiffel Tower (1889) stands in Paris, France. It was designed by Gustave Eiffel's "
  "company. Paris is the capital and the largest city of France."
)
# Each word is one bert-base-uncased token (the window test counts on it).
NUMBERS = (
  "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
  "sixteen seventeen eighteen nineteen twenty"
).split()
CONTEXT_B = (
  "Marie Skłodowska-Curie was a physicist and chemist who conducted pioneering research on "
  "radioactivity. She was the first woman to win a Nobel Prize, the first person to win a Nobel "
  "Prize twice, and the only person to win a Nobel Prize in two scientific fields. Her husband, "
  "Pierre Curie, was a co-winner of her first Nobel Prize. She was, in 1906, the first woman to "
  "become a professor at the University of Paris."
)


# Accents, a word with no tokens (U+200B alone), a question over max_query_length=8.
CONTEXT_C = (
  "Zoë Saldaña (born 1978) is an American actress \u200b who starred in Avatar, the "
  "highest-grossing film of all time."
)
LONG_QUESTION = "Which American actress, born in 1978, starred in the highest-grossing film?"


def tiny_squad():
  """A SQuAD v1.1 file whose offsets test re-anchoring, for tests/test_squad.py."""
  a = CONTEXT_A
  paris2 = a.index("Paris", a.index("Paris") + 1)
  b, c = CONTEXT_B, CONTEXT_C
  return {
    "version": "1.1",
    "data": [
      {
        "title": "A",
        "paragraphs": [
          {
            "context": a,
            "qas": [
              _qa("ok", "When was the tower built?", [("1889", a.index("1889"))]),
              # off by 3 characters: re-anchored (the text occurs once)
              _qa(
                "off", "Who designed it?", [("Gustave Eiffel's company", a.index("Gustave") + 3)]
              ),
              # not in the context at all: dropped
              _qa("absent", "Where else?", [("London", 5)]),
              # "Paris" twice within REANCHOR_WINDOW of the wrong offset: ambiguous, dropped
              _qa("ambiguous", "Which city?", [("Paris", 60)]),
              # near only the second "Paris": re-anchored to it
              _qa("near", "Capital?", [("Paris", paris2 + 40)]),
              # the first answer is unusable, the second becomes the training target
              _qa("second", "Country?", [("Germany", 0), ("France", a.index("France"))]),
            ],
          }
        ],
      },
      {
        "title": "B",
        "paragraphs": [
          {
            "context": " ".join(NUMBERS),
            "qas": [_qa("num", "what is it", [("fifteen", " ".join(NUMBERS).index("fifteen"))])],
          },
          {
            "context": b,
            "qas": [
              _qa("curie", "Who?", [(" Pierre Curie", b.index("Pierre") - 1)]),
              _qa("year", "When professor?", [("1906", b.index("1906"))]),
              _qa("fields", "How many fields?", [("two scientific fields", b.index("two sc"))]),
              _qa("first", "Who was she?", [("physicist and chemist", b.index("physicist"))]),
            ],
          },
          {
            "context": c,
            "qas": [
              _qa("born", "When was she born?", [("1978", c.index("1978"))]),
              _qa("film", "Which film?", [("Avatar", c.index("Avatar"))]),
              _qa("who", LONG_QUESTION, [("Zoë Saldaña", 0)]),
            ],
          },
        ],
      },
    ],
  }


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


# seq 32, stride 8, query 8: several windows per context, the long question truncated.
WINDOWS = {"max_seq_length": 32, "doc_stride": 8, "max_query_length": 8}


def hf_windows(doc):
  from transformers import BertTokenizer
  from transformers.data.processors.squad import SquadExample, squad_convert_examples_to_features

  vocab = os.path.join(os.path.dirname(__file__), "..", "bert_jax", "data")
  tok = BertTokenizer(
    os.path.join(vocab, "bert-base-uncased-vocab.txt"), do_lower_case=True, model_max_length=512
  )
  examples = []
  for article in doc["data"]:
    for paragraph in article["paragraphs"]:
      context = paragraph["context"]
      for qa in paragraph["qas"]:
        text, start = qa["answers"][0]["text"], qa["answers"][0]["answer_start"]
        if context[start : start + len(text)] == text == text.strip():
          examples.append(SquadExample(qa["id"], qa["question"], context, text, start, "", []))
  features = squad_convert_examples_to_features(
    examples,
    tok,
    WINDOWS["max_seq_length"],
    WINDOWS["doc_stride"],
    WINDOWS["max_query_length"],
    is_training=True,
    return_dataset=False,
    threads=1,
    tqdm_enabled=False,
  )
  rows = []
  for f in features:
    n = sum(f.attention_mask)
    rows.append(
      {
        "qid": examples[f.example_index].qas_id,
        "input_ids": f.input_ids[:n],
        "segment_ids": f.token_type_ids[:n],
        "max_context": sorted(int(i) for i, v in f.token_is_max_context.items() if v),
        "token_to_word": sorted([int(i), int(w)] for i, w in f.token_to_orig_map.items()),
        "start_position": int(f.start_position),
        "end_position": int(f.end_position),
      }
    )
  return {**WINDOWS, "rows": rows}


def _write(name, obj, indent=1):
  path = os.path.join(OUT, name)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(obj, f, ensure_ascii=False, indent=indent)
    f.write("\n")
  print(path)


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
  tiny = tiny_squad()
  _write("tiny_v1.json", tiny)
  _write("hf_windows.json", hf_windows(tiny), indent=None)
  _write("metric_cases.json", doc)


if __name__ == "__main__":
  main()
