"""Writes tests/fixtures/metrics/*.json: reference values of the fine-tuning metrics.

  /work/venv-ref/bin/pip install seqeval    # brings scikit-learn; scipy is already there
  /work/venv-ref/bin/python scripts/make_metric_fixtures.py [--out=tests/fixtures/metrics] \
      [--tasks=../shared/data/tasks]

entity_f1.json: tag sequences (hand-made tricky cases and seeded random BIO/IOB1 sequences)
with seqeval's default precision/recall/F1 and entity lists. classification.json and
correlation.json: seeded random labels/scores with sklearn's accuracy, F1 and MCC and
scipy's Pearson and Spearman (ties averaged). wnut16_test.json (when --tasks has
wnut16_ner): seqeval's scores of `perturb(gold)` against the real test split's gold tags,
only the numbers (the test rebuilds the predictions with `perturb` and skips without the
data). tests/test_task_metrics.py compares bert_jax.tasks.metrics against these without
needing seqeval, sklearn or scipy (imported only when this script runs).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import warnings

import numpy as np

# (name, gold, pred): each a list of tag sequences.
CASES = [
  ("exact", [["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-LOC"]]),
  ("i_without_b", [["O", "I-PER", "I-PER", "O"]], [["O", "B-PER", "I-PER", "O"]]),
  ("i_starts_sentence", [["I-LOC", "O"]], [["B-LOC", "O"]]),
  ("type_change_inside", [["B-PER", "I-LOC", "I-LOC"]], [["B-PER", "B-LOC", "I-LOC"]]),
  ("type_change_i_i", [["I-PER", "I-ORG", "O"]], [["B-PER", "I-PER", "O"]]),
  ("entity_at_end", [["O", "O", "B-ORG", "I-ORG"]], [["O", "O", "B-ORG", "I-ORG"]]),
  ("entity_at_end_short", [["O", "O", "B-ORG", "I-ORG"]], [["O", "O", "B-ORG", "O"]]),
  ("b_b_same_type", [["B-PER", "B-PER", "I-PER"]], [["B-PER", "I-PER", "I-PER"]]),
  ("empty_sentence", [[], ["B-PER"]], [[], ["B-PER"]]),
  ("all_o", [["O", "O"], ["O"]], [["O", "O"], ["O"]]),
  ("all_o_gold_pred_entity", [["O", "O"]], [["B-MISC", "O"]]),
  ("no_pred_entity", [["B-MISC", "O"]], [["O", "O"]]),
  ("across_sentences", [["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["I-PER", "O"]]),
  ("hyphen_type", [["B-creative-work", "I-creative-work"]], [["B-creative-work", "O"]]),
  ("iobes", [["S-PER", "B-LOC", "E-LOC", "O"]], [["S-PER", "B-LOC", "I-LOC", "E-LOC"]]),
  (
    "mixed",
    [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "B-ORG"], ["O", "B-MISC", "I-MISC"]],
    [["B-PER", "I-PER", "O", "B-LOC", "O", "O", "B-ORG"], ["B-MISC", "I-MISC", "I-MISC"]],
  ),
]


def _random_tags(rng: random.Random, n: int, types: list[str]) -> list[str]:
  out = []
  for _ in range(n):
    r = rng.random()
    if r < 0.5:
      out.append("O")
    else:  # B- and I- freely mixed, so I- after O and type changes occur often
      out.append(("B-" if r < 0.75 else "I-") + rng.choice(types))
  return out


def perturb(gold: list[list[str]]) -> list[list[str]]:
  """A deterministic "prediction" from gold tags with every kind of BIO error: entities
  dropped, B- turned into I- (IOB1-style starts), entities split, false positives."""
  out, i = [], 0
  for seq in gold:
    pred = []
    for tag in seq:
      if i % 7 == 3:
        tag = "O"
      elif tag.startswith("B-") and i % 3 == 0:
        tag = "I-" + tag[2:]
      elif tag.startswith("I-") and i % 4 == 1:
        tag = "B-" + tag[2:]
      elif tag == "O" and i % 50 == 7:
        tag = "B-person"
      pred.append(tag)
      i += 1
    out.append(pred)
  return out


def read_tags(path: str) -> list[list[str]]:
  with gzip.open(path, "rt") as f:
    return [json.loads(line)["tags"] for line in f if line.strip()]


def tags_digest(tags: list[list[str]]) -> str:
  return hashlib.sha256(json.dumps(tags).encode()).hexdigest()[:16]


def _prf(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
  import seqeval.metrics

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # seqeval warns on zero division (the value is 0.0)
    return {
      "precision": float(seqeval.metrics.precision_score(gold, pred)),
      "recall": float(seqeval.metrics.recall_score(gold, pred)),
      "f1": float(seqeval.metrics.f1_score(gold, pred)),
    }


def entity_cases() -> dict:
  from seqeval.metrics.sequence_labeling import get_entities

  rng = random.Random(0)
  cases = list(CASES)
  for k in range(12):
    types = ["PER", "LOC", "ORG"][: 1 + k % 3]
    gold, pred = [], []
    for _ in range(rng.randint(1, 6)):
      n = rng.randint(0, 12)
      gold.append(_random_tags(rng, n, types))
      # Prediction: the gold with some tags replaced, so some entities match.
      pred.append([t if rng.random() < 0.7 else _random_tags(rng, 1, types)[0] for t in gold[-1]])
    cases.append((f"random_{k}", gold, pred))
  out = []
  for name, gold, pred in cases:
    ents = [list(e) for e in get_entities(gold)] if any(gold) else []
    out.append(
      {"name": name, "gold": gold, "pred": pred, "gold_entities": ents, **_prf(gold, pred)}
    )
  return {"source": "seqeval " + _version("seqeval"), "cases": out}


def _version(pkg: str) -> str:
  from importlib.metadata import version

  return version(pkg)


def classification_cases() -> dict:
  import sklearn.metrics

  rng = np.random.default_rng(0)
  out = []
  for k, (n, classes) in enumerate([(50, 2), (101, 2), (77, 3), (60, 5), (8, 2)]):
    gold = rng.integers(0, classes, n)
    pred = np.where(rng.random(n) < 0.6, gold, rng.integers(0, classes, n))
    row = {"name": f"random_{k}", "pred": pred.tolist(), "gold": gold.tolist()}
    row["accuracy"] = float(sklearn.metrics.accuracy_score(gold, pred))
    row["mcc"] = float(sklearn.metrics.matthews_corrcoef(gold, pred))
    if classes == 2:
      row["f1"] = float(sklearn.metrics.f1_score(gold, pred, pos_label=1))
    out.append(row)
  return {"source": "scikit-learn " + _version("scikit-learn"), "cases": out}


def correlation_cases() -> dict:
  import scipy
  import scipy.stats

  rng = np.random.default_rng(1)
  out = []
  for k, n in enumerate([5, 40, 200]):
    gold = np.round(rng.normal(size=n), 4)  # 4 decimals: a small file, same statistics
    pred = np.round(0.5 * gold + rng.normal(size=n), 4)
    out.append({"name": f"continuous_{k}", "pred": pred.tolist(), "gold": gold.tolist()})
  # Heavy ties, as STS-B's 0..5 scores in steps of 0.2 (or coarser).
  gold = rng.integers(0, 6, 60).astype(float)
  pred = np.round(gold + rng.normal(scale=1.5, size=60))
  out.append({"name": "ties", "pred": pred.tolist(), "gold": gold.tolist()})
  for row in out:
    row["pearson"] = float(scipy.stats.pearsonr(row["pred"], row["gold"])[0])
    row["spearman"] = float(scipy.stats.spearmanr(row["pred"], row["gold"])[0])
  return {"source": "scipy " + scipy.__version__, "cases": out}


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default=os.path.join("tests", "fixtures", "metrics"))
  ap.add_argument("--tasks", default=os.path.join("..", "shared", "data", "tasks"))
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  wnut = os.path.join(args.tasks, "wnut16_ner", "test.jsonl.gz")
  if os.path.isfile(wnut):
    gold = read_tags(wnut)
    data = {"sentences": len(gold), "sha256_16": tags_digest(gold), **_prf(gold, perturb(gold))}
    with open(os.path.join(args.out, "wnut16_test.json"), "w") as f:
      f.write(json.dumps(data) + "\n")
    print(f"wrote {args.out}/wnut16_test.json: {data}")
  for name, data in (
    ("entity_f1", entity_cases()),
    ("classification", classification_cases()),
    ("correlation", correlation_cases()),
  ):
    path = os.path.join(args.out, f"{name}.json")
    # One case a line: small, and a diff shows which case changed.
    cases = ",\n".join(json.dumps(c) for c in data["cases"])
    with open(path, "w") as f:
      f.write(f'{{"source": {json.dumps(data["source"])}, "cases": [\n{cases}\n]}}\n')
    print(f"wrote {path}: {len(data['cases'])} cases")


if __name__ == "__main__":
  main()
