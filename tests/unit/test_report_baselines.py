"""bert_jax.report.baselines: the lexical baselines (tag lookup, overlap sentence, overlap
threshold) on inputs worked by hand."""

import json

import pytest


def test_lexical_baselines_on_known_inputs():
  from bert_jax.report import baselines

  train = [(["the", "dog", "runs"], ["AT", "NN", "VBZ"]), (["the", "run"], ["AT", "NN"]),
           (["dog", "the"], ["VB", "AT"])]  # fmt: skip
  # 'dog' -> NN (1 vs 1: the first seen), 'the' -> AT; unseen 'cat' -> AT (the most frequent).
  test = [(["the", "dog", "cat"], ["AT", "NN", "NN"])]
  assert baselines.tag_lookup_accuracy(train, test) == pytest.approx(2 / 3)
  context = "The tower was finished in 1889. Gustave Eiffel built the tower. It is tall."
  qs = [("Who built the tower?", context, ["Gustave Eiffel"]),
        ("How tall is it?", context, ["tall"])]  # fmt: skip
  # Q1: sentence 2 shares 'built' and 'tower' (sentence 1 only 'tower'; articles are dropped):
  # "Gustave Eiffel built the tower." against "Gustave Eiffel": F1 = 2 * (2/4 * 1) / (2/4 + 1)
  # = 2/3; Q2: "It is tall." against "tall": 2 * (1/3 * 1) / (1/3 + 1) = 0.5. On a tie the
  # first sentence wins.
  assert baselines.overlap_sentence_f1(qs) == pytest.approx(100 * (2 / 3 + 0.5) / 2)
  tie = [("What was built?", "It was built. Gustave Eiffel built it.", ["Gustave Eiffel"])]
  assert baselines.overlap_sentence_f1(tie) == 0.0


def test_overlap_threshold_on_known_inputs(tmp_path):
  from bert_jax.report import baselines

  # Overlaps (the first text's words found in the second; articles would be dropped, so none
  # here): 0.75 E, 0.25 N, 1.0 E, 0.0 N, 0.5 N. Only t = 0.75 (E at or above) gets all 5 right.
  train = [("p q r s", "p q r z", "E"), ("p q r s", "p z y x", "N"), ("p q", "q p", "E"),
           ("p q", "z y", "N"), ("p q r s", "p q y x", "N")]  # fmt: skip
  # 0.75 -> E (right), 0.5 -> N (wrong), 0.0 -> N (right).
  test = [("p q r s", "s r q y", "E"), ("p q", "p z", "E"), ("p q r s", "z", "N")]
  assert baselines.overlap_threshold_accuracy(train, test) == pytest.approx(2 / 3)
  # The side is learned too: with the labels swapped, N at or above 0.75.
  swap = {"E": "N", "N": "E"}
  flip = lambda rows: [(a, b, swap[y]) for a, b, y in rows]
  assert baselines.overlap_threshold_accuracy(flip(train), flip(test)) == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="2 classes, not 3"):
    baselines.overlap_threshold_accuracy([*train, ("p", "p", "X")], test)
  # task_baselines reads a 2-class pair task's files as results.json's config names them.
  for split, rows in (("train", train), ("test", test)):
    lines = [json.dumps({"question": a, "sentence": b, "label": y}) for a, b, y in rows]
    (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
  task = {"train": str(tmp_path / "train.jsonl"), "test": str(tmp_path / "test.jsonl"),
          "text_fields": ["question", "sentence"], "label_field": "label",
          "max_train_examples": 0, "max_eval_examples": 2}  # fmt: skip
  results = {"kind": "classification", "main_metric": "accuracy", "labels": ["E", "N"],
             "baseline": {"name": "majority class", "test": {"accuracy": 0.5}},
             "config": {"task": task}}  # fmt: skip
  # The first 2 test rows: 0.75 -> E right, 0.5 -> N wrong.
  assert baselines.task_baselines(results, "test") == {
    "majority class": 50.0,
    "word-overlap threshold": 50.0,
  }
  one = {**results, "config": {"task": {**task, "text_fields": ["sentence"]}}}
  assert baselines.task_baselines(one, "test") == {"majority class": 50.0}
