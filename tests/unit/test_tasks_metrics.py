"""bert_jax.tasks.metrics: hand-checked values, and parity with seqeval / sklearn / scipy through
the fixtures of tests/fixtures/make_metric_fixtures.py (no reference package needed at test
time); the task kinds' default metrics."""

import importlib.util
import json
import os

import numpy as np
import pytest

from bert_jax.tasks import kinds, metrics

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "metrics")
SCRIPT = os.path.join(os.path.dirname(FIXTURES), "make_metric_fixtures.py")


def _cases(name):
  with open(os.path.join(FIXTURES, f"{name}.json")) as f:
    return json.load(f)["cases"]


def test_classification_hand_checked():
  # gold 1 1 1 0 0 0 0 0 / pred 1 1 0 1 0 0 0 0: TP=2 FN=1 FP=1 TN=4.
  gold = [1, 1, 1, 0, 0, 0, 0, 0]
  pred = [1, 1, 0, 1, 0, 0, 0, 0]
  assert metrics.accuracy(pred, gold) == 6 / 8
  assert metrics.f1(pred, gold) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))  # 2/3
  assert metrics.f1(pred, gold, positive=0) == pytest.approx(2 * 4 / (2 * 4 + 1 + 1))  # 0.8
  # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (8 - 1) / sqrt(3*3*5*5) = 7/15
  assert metrics.matthews_corr(pred, gold) == pytest.approx(7 / 15)
  # Degenerate: one class everywhere -> 0.0 (sklearn's convention); perfect -> 1; inverted -> -1.
  assert metrics.matthews_corr([1, 1, 1], [0, 1, 0]) == 0.0
  assert metrics.matthews_corr(gold, gold) == pytest.approx(1.0)
  assert metrics.matthews_corr([1 - g for g in gold], gold) == pytest.approx(-1.0)
  assert metrics.f1([0, 0], [1, 0]) == 0.0


def test_correlations_hand_checked():
  # x = 1 2 3, y = 1 2 4: centred x = -1 0 1, y = -4/3 -1/3 5/3; r = 3 / sqrt(2 * 42/9).
  assert metrics.pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(3 / np.sqrt(2 * 42 / 9))
  # Ties averaged: ranks of 1 2 2 3 are 1 2.5 2.5 4, of 1 3 2 4 are 1 3 2 4; centred
  # -1.5 0 0 1.5 and -1.5 .5 -.5 1.5: r = 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10).
  np.testing.assert_array_equal(metrics.rankdata([1, 2, 2, 3]), [1, 2.5, 2.5, 4])
  np.testing.assert_array_equal(metrics.rankdata([3, 1, 3, 3, 0]), [4, 2, 4, 4, 1])
  assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / np.sqrt(10))
  assert metrics.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0  # constant: undefined -> 0


def test_tagging_hand_checked():
  # gold chunks: PER(0,1), LOC(3,3) (an I- after O starts a chunk), ORG(4,4): 3;
  # pred chunks: PER(0,1), LOC(3,3): 2, both right. P = 2/2, R = 2/3, F = 2PR/(P+R) = 0.8.
  gold = [["B-PER", "I-PER", "O", "I-LOC", "B-ORG"]]
  pred = [["B-PER", "I-PER", "O", "B-LOC", "O"]]
  r = metrics.entity_f1(gold, pred)
  assert r["precision"] == 1.0 and r["recall"] == pytest.approx(2 / 3)
  assert r["f1"] == pytest.approx(0.8)
  assert metrics.get_entities(gold[0]) == [("PER", 0, 1), ("LOC", 3, 3), ("ORG", 4, 4)]
  # Token accuracy: 3 of 5 words (I-LOC/B-LOC and B-ORG/O differ).
  assert metrics.token_accuracy(pred, gold) == pytest.approx(3 / 5)
  # Words without a gold tag (-1, as label_ids' non-first sub-tokens) are not counted.
  assert metrics.token_accuracy([3, 1, 2, 0], [3, -1, 2, 1]) == pytest.approx(2 / 3)
  assert metrics.token_accuracy([["a", "b"]], [["a", None]]) == 1.0


@pytest.mark.parametrize("case", _cases("entity_f1"), ids=lambda c: c["name"])
def test_entity_f1_equals_seqeval(case):
  r = metrics.entity_f1(case["gold"], case["pred"])
  for key in ("precision", "recall", "f1"):
    assert r[key] == pytest.approx(case[key], abs=1e-12), key
  flat = [t for seq in case["gold"] for t in [*seq, "O"]]
  assert [list(e) for e in metrics.get_entities(flat)] == case["gold_entities"]


def _fixture_script():
  # Imports only the stdlib and numpy at module level: the reference packages stay optional.
  spec = importlib.util.spec_from_file_location("make_metric_fixtures", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.shared_data
def test_entity_f1_equals_seqeval_on_wnut16_test(shared_data):
  script = _fixture_script()
  gold = script.read_tags(str(shared_data / "tasks" / "wnut16_ner" / "test.jsonl.gz"))
  with open(os.path.join(FIXTURES, "wnut16_test.json")) as f:
    want = json.load(f)
  assert len(gold) == want["sentences"] and script.tags_digest(gold) == want["sha256_16"]
  r = metrics.entity_f1(gold, script.perturb(gold))
  for key in ("precision", "recall", "f1"):
    assert r[key] == pytest.approx(want[key], abs=1e-12), key
  assert metrics.entity_f1(gold, gold)["f1"] == 1.0
  assert metrics.is_bio({t for seq in gold for t in seq})


@pytest.mark.shared_data
def test_brown_pos_tags_are_not_bio(shared_data):
  tags = _fixture_script().read_tags(str(shared_data / "tasks" / "brown_pos" / "dev.jsonl.gz"))
  labels = {t for seq in tags for t in seq}
  assert len(labels) > 20 and not metrics.is_bio(labels)
  assert kinds.default_metrics("tagging", sorted(labels)) == ("token_accuracy",)


def test_classification_fixtures_equal_sklearn():
  for case in _cases("classification"):
    p, g = case["pred"], case["gold"]
    assert metrics.accuracy(p, g) == pytest.approx(case["accuracy"], abs=1e-12), case["name"]
    assert metrics.matthews_corr(p, g) == pytest.approx(case["mcc"], abs=1e-12), case["name"]
    if "f1" in case:
      assert metrics.f1(p, g) == pytest.approx(case["f1"], abs=1e-12), case["name"]


def test_correlation_fixtures_equal_scipy():
  for case in _cases("correlation"):
    p, g = case["pred"], case["gold"]
    assert metrics.pearson(p, g) == pytest.approx(case["pearson"], abs=1e-10), case["name"]
    assert metrics.spearman(p, g) == pytest.approx(case["spearman"], abs=1e-10), case["name"]


def test_compute_and_defaults():
  out = metrics.compute(("accuracy", "f1", "mcc"), [1, 0, 1, 1], [1, 0, 0, 1])
  # TP=2 FP=1 FN=0 TN=1: acc 3/4, F1 4/5, MCC (2*1 - 1*0)/sqrt(3*2*1*2) = 2/sqrt(12).
  assert out == pytest.approx({"accuracy": 0.75, "f1": 0.8, "mcc": 2 / np.sqrt(12)})
  tags = metrics.compute(("entity_f1", "token_accuracy"), [["B-X", "O"]], [["B-X", "B-Y"]])
  assert tags == pytest.approx(
    {"entity_f1": 2 / 3, "entity_precision": 1.0, "entity_recall": 0.5, "token_accuracy": 0.5}
  )
  assert kinds.default_metrics("classification") == ("accuracy",)
  assert kinds.default_metrics("regression") == ("pearson", "spearman")
  bio = ["B-PER", "I-PER", "O", "B-creative-work", "I-creative-work"]
  assert kinds.default_metrics("tagging", bio) == ("entity_f1", "token_accuracy")
  # Brown POS tags (IN, NN, ...) are not BIO: token accuracy only.
  assert kinds.default_metrics("tagging", ["IN", "NN", "B", "I-"]) == ("token_accuracy",)
  assert not metrics.is_bio(["O"])


def test_summaries():
  s = metrics.summarize([0.80, 0.84, 0.82])
  assert s == pytest.approx(
    {"mean": 0.82, "std": 0.02, "median": 0.82, "min": 0.80, "max": 0.84, "n": 3}
  )
  assert metrics.summarize([0.5])["std"] == 0.0 and metrics.summarize([0.5])["n"] == 1
  rows = [{"accuracy": 0.8, "f1": 0.7}, {"accuracy": 0.9, "f1": 0.9}]
  out = metrics.summarize_seeds(rows)
  assert out["accuracy"]["mean"] == pytest.approx(0.85)
  assert out["f1"]["std"] == pytest.approx(np.sqrt(0.02))  # ((0.1)^2 * 2) / (2 - 1)
  assert json.loads(json.dumps(out)) == out  # plain floats/ints: results.json-ready


def test_errors():
  with pytest.raises(ValueError, match="3 predictions for 2 gold values"):
    metrics.accuracy([1, 0, 1], [1, 0])
  with pytest.raises(ValueError, match="accuracy: no examples"):
    metrics.accuracy([], [])
  with pytest.raises(ValueError, match="sequence 1 has 1 predicted tags for 2 words"):
    metrics.entity_f1([["O"], ["O", "O"]], [["O"], ["O"]])
  with pytest.raises(ValueError, match="unknown metric 'bleu'"):
    metrics.compute(["bleu"], [1], [1])
  with pytest.raises(ValueError, match="no default metrics for task kind 'span'"):
    kinds.default_metrics("span")
  with pytest.raises(ValueError, match="seed row 1 has metrics"):
    metrics.summarize_seeds([{"a": 1.0}, {"b": 1.0}])
  with pytest.raises(ValueError, match="no word has a gold tag"):
    metrics.token_accuracy([1], [-1])


# ----------------------------------------------------------------------------- baselines


def _rows(labels):
  return [{"label": np.int32(x)} for x in labels]


def test_majority_class_baseline_hand_checked():
  # train: class 1 x3, class 0 x2 -> always "pos". dev: 1 1 0 0 0 -> accuracy 2/5, F1 of class
  # 1 = 2*2 / (2*2 + 3 + 0) = 4/7; test holds an unlabelled row (-1): no baseline there.
  train, dev = _rows([1, 0, 1, 0, 1]), _rows([1, 1, 0, 0, 0])
  test = _rows([1, -1])
  b = kinds.baseline(
    "classification", ("accuracy", "f1"), ("neg", "pos"), train, {"dev": dev, "test": test}
  )
  assert b["name"] == "majority class" and b["prediction"] == "pos"
  assert b["dev"] == {"accuracy": 2 / 5, "f1": pytest.approx(4 / 7)}
  assert b["test"] == {}
  # The majority class (of train) scores exactly its share of dev, as a collapsed model does.
  seeds = [{"accuracy": 2 / 5}, {"accuracy": 0.8}, {"accuracy": 0.2}]
  assert metrics.at_or_below(b, seeds, "dev", "accuracy") == [0, 2]
  assert metrics.at_or_below(b, seeds, "test", "accuracy") == []
  assert metrics.baseline_note(b, "dev", "accuracy", [0, 2], 3) == (
    "; majority class 0.4000: seeds 0, 2 at or below it"
  )
  assert metrics.baseline_note(b, "dev", "accuracy", [0, 1, 2], 3) == (
    "; majority class 0.4000: all 3 seeds at or below it"
  )
  assert metrics.baseline_note(b, "dev", "accuracy", [0], 1) == (
    "; majority class 0.4000: the seed is at or below it"
  )
  assert metrics.baseline_note(b, "dev", "accuracy", [], 3) == "; majority class 0.4000"


def test_other_kinds_baselines():
  # Regression: the train mean (2.0) for every row; a constant correlates 0.0.
  reg = kinds.baseline(
    "regression",
    ("pearson", "spearman"),
    (),
    [{"label": np.float32(x)} for x in (1, 2, 3)],
    {"dev": [{"label": np.float32(x)} for x in (0, 5)]},
  )
  assert reg == {"name": "train mean", "prediction": 2.0, "dev": {"pearson": 0.0, "spearman": 0.0}}
  # Tagging: the most frequent train tag (O, 4 of 6 words) everywhere; -1 (later wordpieces)
  # are not words. dev words: O O B-X -> token accuracy 2/3, entity F1 0.
  labels = ("B-X", "O")
  ids = lambda *x: {"label_ids": np.array(x, np.int32)}
  tag = kinds.baseline(
    "tagging",
    ("entity_f1", "token_accuracy"),
    labels,
    [ids(-1, 0, 1, 1, -1), ids(1, 1, 0, -1)],
    {"dev": [ids(-1, 1, 1, 0, -1)]},
  )
  assert tag["name"] == "majority tag" and tag["prediction"] == "O"
  assert tag["dev"]["token_accuracy"] == pytest.approx(2 / 3) and tag["dev"]["entity_f1"] == 0.0
  # Multiple choice: chance, the mean of 1 / choices (rows of 4 and of 2 choices).
  mc = kinds.baseline(
    "multiple_choice",
    ("accuracy",),
    (),
    [{"input_ids": np.zeros((4, 8)), "label": np.int32(0)}],
    {
      "dev": [
        {"input_ids": np.zeros((4, 8)), "label": np.int32(1)},
        {"input_ids": np.zeros((2, 8)), "label": np.int32(0)},
      ]
    },
  )
  assert mc == {"name": "chance", "prediction": None, "dev": {"accuracy": (1 / 4 + 1 / 2) / 2}}
  # Span QA: none applies, and the printed line says so.
  qa = kinds.baseline("span_qa", ("f1", "exact_match"), (), [], {"dev": []})
  assert qa["name"] == "none"
  assert metrics.baseline_note(qa, "dev", "f1", [], 3).startswith("; no baseline (")
