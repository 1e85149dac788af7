"""Each task's trivial baselines, set beside the fine-tuned scores: the majority class (what
bert_jax.finetune writes in results.json's `baseline`) and, where one is standard, a lexical
baseline computed here from the run's own task files (results.json's config: the files and the
first-N limits the run used):

  tagging   the per-word most-frequent-tag lookup: each word's most frequent tag in the
            training sentences the run trained on (a word it never saw: the most frequent tag
            overall), token accuracy on the split's first N sentences;
  span QA   the sentence of most question overlap: the context sentence sharing the most
            distinct normalised words with the question (the first of equals), as the answer,
            official SQuAD v1.1 F1 on the split's first N questions;
  pairs     (2 classes, 2 text fields: QNLI's kind) the word-overlap threshold: the fraction of
            the first text's distinct normalised words found in the second, one class at or
            above a threshold and the other below, the threshold and the side chosen for the
            best accuracy on the training examples the run trained on (the lowest threshold of
            equals), accuracy on the split's first N examples.
"""

from __future__ import annotations

import collections
import functools
import gzip
import json
import os
import re
from typing import Any

# Sentence ends as tools/tasks/make_mc_task.py cuts them.
_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'“‘])")


def _open(path: str):
  return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path)


def _jsonl(path: str, limit: int) -> list[dict[str, Any]]:
  rows = []
  with _open(path) as f:
    for line in f:
      if line.strip():
        rows.append(json.loads(line))
        if limit and len(rows) >= limit:
          break
  return rows


def tag_lookup_accuracy(
  train: list[tuple[list[str], list[str]]], test: list[tuple[list[str], list[str]]]
) -> float:
  """Token accuracy of tagging each word with its most frequent training tag."""
  by_word: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  overall: collections.Counter = collections.Counter()
  for words, tags in train:
    for w, t in zip(words, tags, strict=True):
      by_word[w][t] += 1
      overall[t] += 1
  fallback = overall.most_common(1)[0][0]
  best = {w: c.most_common(1)[0][0] for w, c in by_word.items()}
  right = total = 0
  for words, tags in test:
    for w, t in zip(words, tags, strict=True):
      right += best.get(w, fallback) == t
      total += 1
  return right / max(total, 1)


def _words(text: str) -> set[str]:
  from bert_jax.tasks import squad

  return set(squad.normalize_answer(text).split())


def overlap_sentence_f1(questions: list[tuple[str, str, list[str]]]) -> float:
  """Official SQuAD v1.1 F1 (x 100) of answering each (question, context, answers) with the
  context sentence of most question-word overlap."""
  from bert_jax.tasks import squad

  gold, pred = {}, {}
  for i, (question, context, answers) in enumerate(questions):
    sents = [s for s in _BOUNDARY.split(context) if s.strip()] or [context]
    q = _words(question)
    pred[str(i)] = max(sents, key=lambda s: len(q & _words(s)))  # max: the first of equals
    gold[str(i)] = answers
  return squad.squad_v1_score(gold, pred)["f1"]


def _overlap(first: str, second: str) -> float:
  words = _words(first)
  return len(words & _words(second)) / max(len(words), 1)


def overlap_threshold_accuracy(
  train: list[tuple[str, str, Any]], test: list[tuple[str, str, Any]]
) -> float:
  """Accuracy on `test` of the word-overlap threshold fitted on `train` (both: (first text,
  second text, label) of a 2-class task; see the module docstring)."""
  labels = sorted({y for _, _, y in train}, key=str)
  if len(labels) != 2:
    raise ValueError(f"the overlap threshold needs 2 classes, not {len(labels)}")
  # One pass up the sorted overlaps: below t so far, of each class (t: each distinct value).
  scored = sorted((_overlap(a, b), y == labels[0]) for a, b, y in train)
  n_first = sum(f for _, f in scored)
  best = (-1, 0.0, labels[0])  # (training examples right, threshold, the class at or above it)
  first_below = other_below = 0
  for i, (t, f) in enumerate(scored):
    if i == 0 or t != scored[i - 1][0]:
      right = (n_first - first_below) + other_below  # the first class at or above t
      for n, side in ((right, labels[0]), (len(scored) - right, labels[1])):
        if n > best[0]:
          best = (n, t, side)
    first_below += f
    other_below += not f
  _, t, side = best
  other = labels[1] if side == labels[0] else labels[0]
  right = sum((side if _overlap(a, b) >= t else other) == y for a, b, y in test)
  return right / max(len(test), 1)


def _squad_questions(paths: str, limit: int) -> list[tuple[str, str, list[str]]]:
  out = []
  for path in paths.split(","):
    with _open(path) as f:
      data = json.load(f)
    for article in data["data"]:
      for p in article["paragraphs"]:
        for qa in p["qas"]:
          out.append((qa["question"], p["context"], [a["text"] for a in qa["answers"]]))
          if limit and len(out) >= limit:
            return out
  return out


@functools.cache
def _lexical(kind: str, files: tuple[str, ...], fields: tuple[str, ...], limits: tuple[int, int]):
  train_path, split_path = files
  if kind == "tagging":
    tokens, tags = fields
    read = lambda p, n: [(r[tokens], r[tags]) for r in _jsonl(p, n)]
    value = tag_lookup_accuracy(read(train_path, limits[0]), read(split_path, limits[1]))
    return "per-word tag lookup", 100.0 * value
  if kind == "span_qa":
    return "max-overlap sentence", overlap_sentence_f1(_squad_questions(split_path, limits[1]))
  if kind == "pairs":
    first, second, label = fields
    read = lambda p, n: [(r[first], r[second], r[label]) for r in _jsonl(p, n)]
    value = overlap_threshold_accuracy(read(train_path, limits[0]), read(split_path, limits[1]))
    return "word-overlap threshold", 100.0 * value
  return None


# Written beside a collected results.json (tools/replication/collect.py) where its task files
# are not: {split: {name: value}}, what task_baselines found when the files were there.
SAVED = "baselines.json"


def task_baselines(results: dict[str, Any], split: str, path: str = "") -> dict[str, float]:
  """{baseline name: value x 100 (F1 as the SQuAD script's percent)} of a results.json (at
  `path`) on `split`: the majority class it records, and the task's lexical baseline where its
  files are readable (else as saved beside it in SAVED)."""
  saved = os.path.join(os.path.dirname(path), SAVED) if path else ""
  if saved and os.path.isfile(saved):
    with open(saved) as f:
      return json.load(f).get(split, {})
  out = {}
  base = results.get("baseline") or {}
  metric = results.get("main_metric")
  value = (base.get(split) or {}).get(metric)
  if base.get("name") not in (None, "none") and value is not None:
    out[base["name"]] = 100.0 * value
  task = ((results.get("config") or {}).get("task")) or {}
  kind = results.get("kind")
  fields: tuple[str, ...] = (
    str(task.get("tokens_field", "tokens")),
    str(task.get("tags_field", "tags")),
  )
  text_fields = tuple(task.get("text_fields") or ())
  if kind == "classification" and len(text_fields) == 2 and len(results.get("labels") or ()) == 2:
    kind, fields = "pairs", (*text_fields, str(task.get("label_field", "label")))
  if kind in ("tagging", "span_qa", "pairs") and task.get(split) and task.get("train"):
    limits = (int(task.get("max_train_examples") or 0), int(task.get("max_eval_examples") or 0))
    try:
      found = _lexical(kind, (task["train"], task[split]), fields, limits)
    except (OSError, ValueError, KeyError, TypeError):
      found = None  # the files moved (a copied results.json): the majority class only
    if found:
      out[found[0]] = found[1]
  return out
