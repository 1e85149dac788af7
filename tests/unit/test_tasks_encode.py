"""Tests for bert_jax.tasks.encode: examples -> unpadded model rows (BERT's ids, pairs cut as
its `_truncate_seq_pair`, a word's tag on its first sub-token, multiple choice's endings)."""

import math
import re

import numpy as np
import pytest

from bert_jax.tasks import encode as encode_lib
from bert_jax.tasks import readers
from bert_jax.tasks.formats import TaggedExample, TextExample
from unit import test_tasks_readers as unit_readers
from unit.test_tasks_readers import GENERIC, make_task

CLS, SEP, PAD, UNK = unit_readers.CLS, unit_readers.SEP, unit_readers.PAD, unit_readers.UNK
# The readers' tests' tokenizer (the bundled vocab), shared here.
tok = unit_readers.tok


def _ids(rows, key="input_ids"):
  return [r[key].tolist() for r in rows]


def test_encode_single_and_pair_with_hand_checked_ids(tok):
  single = [TextExample(("hello world",), "pos", "s:1"), TextExample(("the cat sat",), None, "s:2")]
  enc = encode_lib.encode(single, "classification", tok, 128, ["neg", "pos"])
  assert _ids(enc.rows) == [[CLS, 7592, 2088, SEP], [CLS, 1996, 4937, 2938, SEP]]
  assert _ids(enc.rows, "segment_ids") == [[0] * 4, [0] * 5]
  assert [int(r["label"]) for r in enc.rows] == [1, -1]
  assert [int(r["example_index"]) for r in enc.rows] == [0, 1]
  assert (enc.n_examples, enc.n_truncated) == (2, 0)
  assert enc.rows[0]["input_ids"].dtype == np.int32 and enc.rows[0]["label"].dtype == np.int32

  pair = [TextExample(("the cat sat", "hello world"), "neg", "p:1")]
  enc = encode_lib.encode(pair, "classification", tok, 128, ["neg", "pos"])
  assert _ids(enc.rows) == [[CLS, 1996, 4937, 2938, SEP, 7592, 2088, SEP]]
  assert _ids(enc.rows, "segment_ids") == [[0, 0, 0, 0, 0, 1, 1, 1]]
  assert int(enc.rows[0]["label"]) == 0


def test_encode_truncation_counts(tok):
  # 3 + 2 tokens into 7 - 3 = 4: the longer text (a) loses its last token.
  pair = [TextExample(("the cat sat", "hello world"), "x", "p:1")]
  enc = encode_lib.encode(pair, "classification", tok, 7, ["x"])
  assert _ids(enc.rows) == [[CLS, 1996, 4937, SEP, 7592, 2088, SEP]]
  assert _ids(enc.rows, "segment_ids") == [[0, 0, 0, 0, 1, 1, 1]]
  assert enc.n_truncated == 1
  single = [TextExample(("a b c d e f",), "x", "s:1"), TextExample(("hello",), "x", "s:2")]
  enc = encode_lib.encode(single, "classification", tok, 5, ["x"])
  assert _ids(enc.rows) == [[CLS, 1037, 1038, 1039, SEP], [CLS, 7592, SEP]]
  assert enc.n_truncated == 1


def _truncate_pair_reference(a: list, b: list, max_tokens: int) -> tuple[int, int]:
  # google-research/bert run_classifier._truncate_seq_pair, token by token.
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    if len(a) > len(b):
      a.pop()
    else:
      b.pop()
  return len(a), len(b)


def test_truncate_pair_equals_berts_loop():
  for la in range(12):
    for lb in range(12):
      for budget in range(0, 25):
        want = _truncate_pair_reference(range(la), range(lb), budget)
        assert encode_lib.truncate_pair(la, lb, budget) == want, (la, lb, budget)


def test_encode_regression(tok):
  examples = [TextExample(("hello", "world"), 3.8, "r:1"), TextExample(("hello",), None, "r:2")]
  enc = encode_lib.encode(examples, "regression", tok, 16, [])
  assert enc.rows[0]["label"].dtype == np.float32
  assert float(enc.rows[0]["label"]) == pytest.approx(3.8)
  assert math.isnan(float(enc.rows[1]["label"]))


def test_encode_unknown_label_names_source(tok):
  with pytest.raises(ValueError, match=re.escape("d:4: label 'maybe' is not one of the 2 labels")):
    encode_lib.encode([TextExample(("a",), "maybe", "d:4")], "classification", tok, 16, ["n", "y"])


def test_encode_tagging_first_sub_token(tok):
  examples = readers.read_split(
    make_task(kind="tagging", train=str(GENERIC / "ner.jsonl")), "train"
  )
  labels = ["B-LOC", "B-PER", "I-LOC", "O"]
  enc = encode_lib.encode(examples, "tagging", tok, 128, labels)
  # john lives in new york | johan ##son, [UNK] (U+200B has no sub-tokens), una ##ffa ##ble
  assert _ids(enc.rows) == [
    [CLS, 2198, 3268, 1999, 2047, 2259, SEP],
    [CLS, 13093, 3385, UNK, 14477, 20961, 3468, SEP],
  ]
  assert _ids(enc.rows, "label_ids") == [[-1, 1, 3, 3, 0, 2, -1], [-1, 1, -1, 3, 3, -1, -1, -1]]
  assert [int(r["n_words"]) for r in enc.rows] == [5, 3]
  assert _ids(enc.rows, "segment_ids") == [[0] * 7, [0] * 8]
  assert enc.n_truncated == 0

  # 4 sub-tokens fit: "york" is dropped (with its gold tag), "unaffable" keeps its first piece.
  enc = encode_lib.encode(examples, "tagging", tok, 6, labels)
  assert _ids(enc.rows) == [[CLS, 2198, 3268, 1999, 2047, SEP], [CLS, 13093, 3385, UNK, 14477, SEP]]
  assert _ids(enc.rows, "label_ids") == [[-1, 1, 3, 3, 0, -1], [-1, 1, -1, 3, 3, -1]]
  assert [int(r["n_words"]) for r in enc.rows] == [4, 3]
  assert enc.n_truncated == 2

  unlabelled = [TaggedExample(("John", "lives"), None, "u:1")]
  enc = encode_lib.encode(unlabelled, "tagging", tok, 16, labels)
  # An unlabelled sentence: each word's first sub-token is marked (its tag is unknown, no loss
  # or metric reads it; the predictions file does).
  unknown = encode_lib.UNKNOWN_TAG
  assert _ids(enc.rows, "label_ids") == [[-1, unknown, unknown, -1]]
  assert int(enc.rows[0]["n_words"]) == 2


def test_encode_multiple_choice_shapes(tok):
  path = str(GENERIC / "choices.jsonl")
  task = make_task(kind="multiple_choice", train=path, text_fields=("ctx", "endings"))
  enc = encode_lib.encode(readers.read_split(task, "train"), "multiple_choice", tok, 128, [])
  first, second = enc.rows
  assert first["input_ids"].shape == (3, 7) and second["input_ids"].shape == (3, 11)
  assert first["input_ids"].tolist() == [
    [CLS, 1996, 4937, SEP, 2938, SEP, PAD],
    [CLS, 1996, 4937, SEP, 7592, 2088, SEP],
    [CLS, 1996, 4937, SEP, 2003, 3835, SEP],
  ]
  assert first["segment_ids"].tolist() == [
    [0, 0, 0, 0, 1, 1, 0],
    [0, 0, 0, 0, 1, 1, 1],
    [0, 0, 0, 0, 1, 1, 1],
  ]
  assert (int(first["label"]), int(second["label"])) == (0, 2)
  assert enc.n_truncated == 0
  # 8 - 3 = 5 tokens for "paris is" + "a b c d e f": only that choice is cut.
  enc = encode_lib.encode(readers.read_split(task, "train"), "multiple_choice", tok, 8, [])
  assert enc.rows[1]["input_ids"][1].tolist() == [CLS, 3000, 2003, SEP, 1037, 1038, 1039, SEP]
  assert enc.n_truncated == 1
