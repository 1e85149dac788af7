"""bert_jax.tasks.squad: reading + re-anchoring, windows, n-best decoding, the official EM/F1."""

import gzip
import json
import math
import pathlib
import time

import numpy as np
import pytest

from bert_jax.tasks import squad
from bert_jax.tokenizers import tokenizer as tokenizer_lib

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "squad"


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())


# Written by tests/fixtures/make_squad_fixtures.py (offsets wrong on purpose are commented there).
TINY = json.loads((FIXTURES / "tiny_v1.json").read_text(encoding="utf-8"))
CONTEXT_A = TINY["data"][0]["paragraphs"][0]["context"]
NUMBERS = TINY["data"][1]["paragraphs"][0]["context"].split()
CONTEXT_B = TINY["data"][1]["paragraphs"][1]["context"]


@pytest.fixture
def squad_file(tmp_path):
  path = tmp_path / "tiny.json.gz"
  with gzip.open(path, "wt", encoding="utf-8") as f:
    json.dump(TINY, f)
  return str(path)


def test_read_squad_reanchors_and_counts(squad_file):
  examples, stats = squad.read_squad(squad_file)
  by_id = {e.qid: e for e in examples}
  assert len(examples) == 14
  assert {k: stats[k] for k in ("checked", "ok", "reanchored", "dropped", "untrainable")} == {
    "checked": 15,
    "ok": 10,
    "reanchored": 2,
    "dropped": 3,
    "untrainable": 2,
  }
  assert stats["examples"][0] == f"off: reanchored to {CONTEXT_A.index('Gustave')}"
  assert any(
    s.startswith("ambiguous: answer 'Paris' at 60 is ambiguous") for s in stats["examples"]
  )
  paris2 = CONTEXT_A.index("Paris", CONTEXT_A.index("Paris") + 1)
  assert by_id["near"].answer_start == paris2
  assert by_id["absent"].answer_start is None and by_id["absent"].answers == ("London",)
  assert by_id["ambiguous"].answer_start is None
  assert by_id["second"].answers == ("France", "Germany")
  assert by_id["second"].answer_start == CONTEXT_A.index("France")
  # surrounding whitespace is dropped from the text, and the offset follows it
  assert by_id["curie"].answers == ("Pierre Curie",)
  assert by_id["curie"].answer_start == CONTEXT_B.index("Pierre")
  for e in examples:
    if e.answer_start is not None:
      assert e.context[e.answer_start :].startswith(e.answers[0]), e.qid
  assert by_id["num"].source.endswith("tiny.json.gz:1/0/0")
  # never trained on: the untrainable examples produce no training rows
  enc, metas = squad.encode_squad(examples, _tok(), 32, 8, 8, training=True)
  used = {int(r["example_index"]) for r in enc.rows}
  assert {examples[i].qid for i in used} == set(by_id) - {"absent", "ambiguous"}
  assert enc.n_examples == 12
  examples = squad.read_squad([squad_file, squad_file], max_examples=16)[0]
  assert len(examples) == 16 and examples[15].qid == "off"


def _tok():
  return tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())


def test_read_squad_v2_and_errors(tmp_path):
  doc = {
    "version": "v2.0",
    "data": [
      {
        "paragraphs": [
          {
            "context": "Cats sleep a lot.",
            "qas": [
              {
                "id": "yes",
                "question": "What do cats do?",
                "answers": [{"text": "sleep", "answer_start": 5}],
                "is_impossible": False,
              },
              {
                "id": "no",
                "question": "What do dogs do?",
                "answers": [],
                "plausible_answers": [{"text": "sleep", "answer_start": 5}],
                "is_impossible": True,
              },
            ],
          }
        ]
      }
    ],
  }
  path = tmp_path / "v2.json"
  path.write_text(json.dumps(doc))
  examples, stats = squad.read_squad(str(path))
  assert [(e.qid, e.is_impossible, e.answers, e.answer_start) for e in examples] == [
    ("yes", False, ("sleep",), 5),
    ("no", True, (), None),
  ]
  assert stats["checked"] == 1 and stats["untrainable"] == 0
  enc, _ = squad.encode_squad(examples, _tok(), 32, 8, 8, training=True)
  assert enc.n_examples == 2
  impossible = [r for r in enc.rows if int(r["example_index"]) == 1]
  assert [(int(r["start_positions"]), int(r["end_positions"])) for r in impossible] == [(0, 0)]

  # an unlabelled question (no answers, not is_impossible): kept, never trained on
  doc["data"][0]["paragraphs"][0]["qas"][1] = {
    "id": "unlabelled",
    "question": "Why?",
    "answers": [],
  }
  path.write_text(json.dumps(doc))
  examples, stats = squad.read_squad(str(path))
  assert examples[1].answers == () and not examples[1].is_impossible
  assert stats["untrainable"] == 1
  assert squad.encode_squad(examples, _tok(), 32, 8, 8, training=True)[0].n_examples == 1
  assert squad.encode_squad(examples, _tok(), 32, 8, 8, training=False)[0].n_examples == 2

  del doc["data"][0]["paragraphs"][0]["qas"][0]["question"]
  path.write_text(json.dumps(doc))
  with pytest.raises(ValueError, match=r"v2.json:0/0/0: missing or malformed 'question'"):
    squad.read_squad(str(path))
  path.write_text('{"data": [\n oops')
  with pytest.raises(ValueError, match=r"v2.json:2: not valid JSON"):
    squad.read_squad(str(path))


def test_max_context_by_hand():
  assert squad.window_starts(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
  assert squad.max_context_window(squad.window_starts(10, 4, 2), 10).tolist() == [
    0, 0, 0, 1, 1, 2, 2, 3, 3, 3,
  ]  # fmt: skip
  # token 4: min(2, 1) + 0.04 in window 1 beats min(0, 2) + 0.03 in window 2
  assert squad.window_starts(7, 4, 2) == [(0, 4), (2, 4), (4, 3)]
  assert squad.max_context_window([(0, 4), (2, 4), (4, 3)], 7).tolist() == [0, 0, 0, 1, 1, 2, 2]
  # a tie (token 2: 1.04 in both) goes to the first window
  assert squad.max_context_window([(0, 4), (1, 4)], 5).tolist() == [0, 0, 0, 1, 1]
  # equal min(left, right) = 0 for token 3 in both: the first wins
  assert squad.window_starts(6, 4, 3) == [(0, 4), (3, 3)]
  assert squad.max_context_window([(0, 4), (3, 3)], 6).tolist() == [0, 0, 0, 0, 1, 1]
  # token 0 has min(left, right) = 0 in both: the longer window wins by 0.01 * length
  # (doc_stride windows never put a longer window after a shorter one; the rule is general)
  assert squad.max_context_window([(0, 2), (0, 4)], 4).tolist() == [1, 1, 1, 1]
  assert squad.window_starts(3, 4, 2) == [(0, 3)]


def test_windows_of_a_long_context(tok):
  ex = squad.QAExample(
    qid="q",
    question="what is it",  # 3 tokens, truncated to max_query_length=2
    context=" ".join(NUMBERS),
    answers=("fifteen",),
    answer_start=" ".join(NUMBERS).index("fifteen"),
    is_impossible=False,
    source="t",
  )
  enc, metas = squad.encode_squad(
    [ex], tok, max_seq_length=13, doc_stride=3, max_query_length=2, training=True
  )
  assert enc.n_examples == 1 and enc.n_truncated == 1
  # 13 - 2 - 3 = 8 context tokens per window, advancing by 3: 0, 3, 6, 9, 12 (12 + 8 = 20)
  assert [m.doc_start for m in metas] == [0, 3, 6, 9, 12]
  cls, sep = tok.cls_id, tok.sep_id
  query = tok.encode("what is")
  number_ids = tok.encode_batch(NUMBERS)
  assert all(len(p) == 1 for p in number_ids)
  covered = np.zeros(20, int)
  for w, (row, meta) in enumerate(zip(enc.rows, metas, strict=True)):
    start = 3 * w
    assert row["input_ids"].dtype == np.int32
    assert row["input_ids"].tolist() == [
      cls,
      *query,
      sep,
      *[p[0] for p in number_ids[start : start + 8]],
      sep,
    ]
    assert row["segment_ids"].tolist() == [0] * 4 + [1] * 9
    assert meta.token_to_word.tolist() == [-1] * 4 + list(range(start, start + 8)) + [-1]
    assert meta.doc_offset == 4 and meta.example_index == 0 and int(row["example_index"]) == 0
    covered[meta.token_to_word[meta.token_is_max_context]] += 1
    assert not meta.token_is_max_context[meta.token_to_word < 0].any()
  assert covered.tolist() == [1] * 20  # every doc token max-context in exactly one window
  best = squad.max_context_window(squad.window_starts(20, 8, 3), 20)
  # "fifteen" is doc token 14: in windows 2 (6..13 excluded), 3 (9..16) and 4 (12..19)
  pos = [(int(r["start_positions"]), int(r["end_positions"])) for r in enc.rows]
  assert pos == [(0, 0), (0, 0), (0, 0), (4 + 14 - 9, 4 + 14 - 9), (4 + 14 - 12, 4 + 14 - 12)]
  assert best[14] == 3 and metas[3].token_is_max_context[4 + 14 - 9]
  with pytest.raises(ValueError, match="leaves no room for the context"):
    squad.encode_squad([ex], tok, max_seq_length=8, max_query_length=5, training=False)


def test_windows_equal_run_squad_reference(tok):
  """Rows, max-context flags, word maps and positions equal transformers' run_squad port."""
  ref = json.loads((FIXTURES / "hf_windows.json").read_text(encoding="utf-8"))
  examples, _ = squad.read_squad(str(FIXTURES / "tiny_v1.json"))
  by_id = {e.qid: e for e in examples}
  qids = list(dict.fromkeys(r["qid"] for r in ref["rows"]))
  assert len(qids) == 8 and len(ref["rows"]) == 39
  sizes = {k: ref[k] for k in ("max_seq_length", "doc_stride", "max_query_length")}
  enc, metas = squad.encode_squad([by_id[q] for q in qids], tok, **sizes, training=True)
  assert enc.n_truncated == 1  # the long question
  got = [
    {
      "qid": qids[m.example_index],
      "input_ids": r["input_ids"].tolist(),
      "segment_ids": r["segment_ids"].tolist(),
      "max_context": np.flatnonzero(m.token_is_max_context).tolist(),
      "token_to_word": [[i, int(w)] for i, w in enumerate(m.token_to_word) if w >= 0],
      "start_position": int(r["start_positions"]),
      "end_position": int(r["end_positions"]),
    }
    for r, m in zip(enc.rows, metas, strict=True)
  ]
  assert got == ref["rows"]


def _oracle_logits(enc, metas):
  """One-hot start/end logits at the gold answer's doc tokens, in every window holding them."""
  gold = {}
  for row, meta in zip(enc.rows, metas, strict=True):
    if int(row["start_positions"]):
      to_doc = meta.doc_start - meta.doc_offset
      gold[meta.example_index] = (
        int(row["start_positions"]) + to_doc,
        int(row["end_positions"]) + to_doc,
      )
  starts, ends = [], []
  for meta in metas:
    start, end = np.zeros(len(meta.input_ids) + 3), np.zeros(len(meta.input_ids) + 3)  # padded
    if meta.example_index in gold:
      s, e = (g - meta.doc_start + meta.doc_offset for g in gold[meta.example_index])
      if 0 <= s < len(meta.input_ids):
        start[s] = 10.0
      if 0 <= e < len(meta.input_ids):
        end[e] = 10.0
    starts.append(start)
    ends.append(end)
  return gold, starts, ends


def test_gold_positions_decode_to_the_answer(squad_file, tok):
  examples, _ = squad.read_squad(squad_file)
  enc, metas = squad.encode_squad(examples, tok, 32, 8, 8, training=True)
  assert len(enc.rows) > enc.n_examples  # several windows per example
  gold, starts, ends = _oracle_logits(enc, metas)
  pred, diffs = squad.decode(examples, metas, starts, ends, tokenizer=tok)
  assert diffs == {}
  trained = [e for i, e in enumerate(examples) if i in gold]
  assert len(trained) == 12
  for e in trained:
    # "(1889)" -> "1889", "Avatar," -> "Avatar", "Zoë Saldaña" keeps its accents
    assert pred[e.qid] == e.answers[0], e.qid
  # without the tokenizer the answer is the whole doc words
  pred_words, _ = squad.decode(examples, metas, starts, ends)
  assert pred_words["ok"] == "(1889)" and pred_words["second"] == "France."


def _meta(n_query, n_doc, max_context=None, doc_start=0):
  """A window `[CLS] q*n_query [SEP] d*n_doc [SEP]` over words doc_start + 0..n_doc-1."""
  n = n_query + n_doc + 3
  token_to_word = np.full(n, -1, np.int32)
  token_to_word[n_query + 2 : n_query + 2 + n_doc] = np.arange(doc_start, doc_start + n_doc)
  is_max = token_to_word >= 0 if max_context is None else np.asarray(max_context, bool)
  return squad.WindowMeta(0, token_to_word, is_max, np.zeros(n, np.int32), n_query + 2, doc_start)


def _ex(words, qid="q"):
  return squad.QAExample(qid, "q?", " ".join(words), (words[0],), 0, False, "t")


def test_nbest_skips_invalid_pairs():
  ex = _ex([f"w{i}" for i in range(10)])
  max_context = [4 <= i < 14 for i in range(15)]  # doc tokens at positions 4..13 = words 0..9

  def run(points, max_context=max_context, **kw):
    # logits -100 except at the given (position, value) points
    start, end = np.full(15, -100.0), np.full(15, -100.0)
    for p, v in points.get("start", ()):
      start[p] = v
    for p, v in points.get("end", ()):
      end[p] = v
    meta = _meta(2, 10, max_context)
    return squad.decode([ex], [meta], [start], [end], **kw)[0]["q"]

  target = {"start": [(7, 1.0)], "end": [(8, 1.0)]}  # words 3..4, score 2
  assert run(target) == "w3 w4"
  # [CLS], query tokens and the final [SEP] never start or end an answer
  special = {"start": [(0, 50.0), (2, 50.0)], "end": [(0, 50.0), (1, 50.0), (14, 50.0)]}
  assert run({k: target[k] + special[k] for k in target}) == "w3 w4"
  # end before start (6 < 10)
  backwards = {"start": [(10, 50.0)], "end": [(6, 50.0)]}
  assert run({k: target[k] + backwards[k] for k in target}) == "w3 w4"
  # words 0..8 = 9 tokens > max_answer_length 5 (and each end too far from the target start)
  target_long = {"start": [(7, 1.0)], "end": [(9, 1.0)]}  # words 3..5
  too_long = {"start": [(4, 50.0)], "end": [(12, 50.0)]}
  assert run({k: target_long[k] + too_long[k] for k in target}, max_answer_length=5) == "w3 w4 w5"
  assert run({k: target_long[k] + too_long[k] for k in target}, max_answer_length=9) == (
    " ".join(f"w{i}" for i in range(9))
  )
  # a start where this window does not have max context (end need not)
  no_max = {"start": [(5, 50.0)], "end": [(6, 50.0)]}
  assert run({k: target[k] + no_max[k] for k in target}) == "w1 w2"
  masked = [m and i != 5 for i, m in enumerate(max_context)]
  assert run({k: target[k] + no_max[k] for k in target}, max_context=masked) == "w3 w4"
  # n_best=1: only start 10 and end 6 are considered, no valid pair: empty prediction
  assert run({k: target[k] + backwards[k] for k in target}, n_best=1) == ""


def test_nbest_across_windows_and_null_score():
  ex = _ex([f"w{i}" for i in range(6)])
  # two windows over words 0..3 and 2..5; word 2/3 max context in the first, 4/5 in the second
  m0 = _meta(1, 4, [False] * 3 + [True] * 4 + [False], doc_start=0)
  m1 = _meta(1, 4, [False] * 5 + [True] * 2 + [False], doc_start=2)
  s0, e0 = np.zeros(8), np.zeros(8)
  s1, e1 = np.zeros(8), np.zeros(8)
  s0[5], e0[6] = 3.0, 3.0  # words 2..3 in window 0: score 6
  s1[3], e1[4] = 9.0, 9.0  # word 2 in window 1 is not max context there: ignored
  s1[5], e1[5] = 4.0, 4.0  # word 4..4 in window 1: score 8 -> wins
  s0[0], e0[0] = 2.0, 1.0  # null in window 0: 3
  s1[0], e1[0] = 5.0, 5.0  # null in window 1: 10; the null score is the min, 3
  args = ([ex], [m0, m1], [s0, s1], [e0, e1])
  pred, diffs = squad.decode(*args)
  assert pred == {"q": "w4"} and diffs == {}
  pred, diffs = squad.decode(*args, version_2=True)
  assert diffs == {"q": 3.0 - 8.0} and pred == {"q": "w4"}
  pred, _ = squad.decode(*args, version_2=True, null_threshold=-6.0)
  assert pred == {"q": ""}
  assert squad.apply_null_threshold({"q": "w4"}, diffs, -5.0) == {"q": "w4"}
  assert squad.apply_null_threshold({"q": "w4"}, diffs, -5.5) == {"q": ""}
  with pytest.raises(ValueError, match="2 windows but 1 start"):
    squad.decode([ex], [m0, m1], [s0], [e0, e1])


def test_official_v1_metric_matches_reference():
  cases = json.loads((FIXTURES / "metric_cases.json").read_text(encoding="utf-8"))["v1"]
  gold = {c["qid"]: c["references"] for c in cases["cases"]}
  pred = {c["qid"]: c["prediction"] for c in cases["cases"] if c["prediction"] is not None}
  for qid, expected in cases["per_question"].items():
    got = squad.squad_v1_score({qid: gold[qid]}, pred)
    assert got == pytest.approx(expected, rel=1e-6), qid
  got = squad.squad_v1_score(gold, {**pred, **cases["extra_prediction"]})
  assert got == pytest.approx(cases["total"], rel=1e-6)
  # evaluate-v1.1 (by hand): both sides normalise to nothing -> EM 1 but F1 0
  assert squad.squad_v1_score({"q": ["The"]}, {"q": "a"}) == {"exact_match": 100.0, "f1": 0.0}
  assert squad.normalize_answer("  The  Théâtre, an (old) one!") == "théâtre old one"
  with pytest.raises(ValueError, match="question q has no reference answer"):
    squad.squad_v1_score({"q": []}, {"q": "x"})


def test_v2_threshold_matches_reference():
  cases = json.loads((FIXTURES / "metric_cases.json").read_text(encoding="utf-8"))["v2"]
  gold = {c["qid"]: c["references"] for c in cases["cases"]}
  pred = {c["qid"]: c["prediction"] for c in cases["cases"]}
  diffs = {c["qid"]: c["diff"] for c in cases["cases"]}
  assert squad.squad_v2_score(gold, pred) == pytest.approx(cases["no_null"])
  threshold, best = squad.squad_v2_best_threshold(gold, pred, diffs)
  assert best["f1"] == pytest.approx(cases["best_f1"])
  # by hand: diffs sorted n3 4.0, n4 3.0, a3 2.5, n1 1.5, a4 1.0, a2 0.5, n2 -1.0, a1 -3.0;
  # null for the top 4 (+4 no-answer, a3 loses 0) beats also nulling a4 (-2/3): 1.25 threshold
  assert threshold == 1.25
  assert type(threshold) is float and type(best["f1"]) is float  # JSON-ready
  assert best["exact_match"] == pytest.approx(100.0 * 4 / 8)  # n3 n4 n1 null, a1 right
  applied = squad.apply_null_threshold(pred, diffs, threshold)
  assert squad.squad_v2_score(gold, applied) == pytest.approx(best)
  # all null / none null
  _, none = squad.squad_v2_best_threshold({"a": ["x"]}, {"a": "x"}, {"a": 5.0})
  t_all, all_null = squad.squad_v2_best_threshold({"a": []}, {"a": "x"}, {"a": -5.0})
  assert none["f1"] == 100.0 and t_all == -6.0 and all_null["f1"] == 100.0
  # tied diffs cannot be separated
  t, tied = squad.squad_v2_best_threshold(
    {"a": ["x"], "b": []}, {"a": "x", "b": "y"}, {"a": 1.0, "b": 1.0}
  )
  assert tied["f1"] == 50.0 and math.isfinite(t)


def test_answer_text_alignment_matches_reference():
  cases = json.loads((FIXTURES / "metric_cases.json").read_text(encoding="utf-8"))["final_text"]
  assert len(cases) == 8
  for pred_text, orig_text, expected in cases:
    assert squad._final_text(pred_text, orig_text, lowercase=True) == expected, orig_text


def test_write_predictions(tmp_path):
  path = tmp_path / "out" / "predictions.json"
  squad.write_predictions(path, {"q1": "Théâtre", "q2": ""})
  assert json.loads(path.read_text(encoding="utf-8")) == {"q1": "Théâtre", "q2": ""}
  assert "Théâtre" in path.read_text(encoding="utf-8")


@pytest.mark.shared_data
def test_squadshifts(shared_data, tok):
  root = shared_data / "tasks" / "squadshifts"
  counts = {}
  for domain in ("amazon_reviews", "new_wiki", "nyt", "reddit"):
    examples, stats = squad.read_squad(str(root / f"{domain}_v1.0.json.gz"))
    counts[domain] = (len(examples), stats)
  n, stats = counts["amazon_reviews"]
  print("amazon_reviews offset check:", {k: v for k, v in stats.items() if k != "examples"})
  assert n == 9877
  assert {k: stats[k] for k in ("checked", "ok", "reanchored", "dropped", "untrainable")} == {
    "checked": 27198,
    "ok": 26251,
    "reanchored": 925,
    "dropped": 22,
    "untrainable": 5,
  }
  assert [counts[d][0] for d in ("new_wiki", "nyt", "reddit")] == [7936, 10056, 9767]
  assert [counts[d][1]["dropped"] for d in ("new_wiki", "nyt", "reddit")] == [0, 0, 0]

  examples, _ = squad.read_squad(str(root / "new_wiki_v1.0.json.gz"))
  t = time.perf_counter()
  enc, metas = squad.encode_squad(examples, tok, 384, 128, 64, training=True)
  seconds = time.perf_counter() - t
  assert enc.n_examples == 7936 and len(enc.rows) == len(metas) > 7936
  # ~1.2 s on an idle 2-core machine; the bound leaves room for a loaded one
  assert seconds < 30, seconds
  assert max(len(r["input_ids"]) for r in enc.rows) == 384
  gold, starts, ends = _oracle_logits(enc, metas)
  pred, _ = squad.decode(examples, metas, starts, ends, tokenizer=tok)
  # Misses: answers over 30 tokens and answers that start or end inside a word.
  first = {e.qid: [e.answers[0]] for e in examples}
  assert squad.squad_v1_score(first, pred)["exact_match"] > 99.5
