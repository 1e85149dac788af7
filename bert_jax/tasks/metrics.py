"""Host-side (numpy) metrics of fine-tuned tasks, and statistics over seeds.

Every metric returns a fraction (0.83, not 83.0); the report multiplies by 100. Classification
metrics take class indices, tagging metrics tag sequences. Argument order is (preds, golds)
everywhere except `entity_f1(gold, pred)`, which keeps seqeval's (y_true, y_pred) order.

  compute(("accuracy", "f1"), preds, golds) -> {"accuracy": 0.84, "f1": 0.88}
  summarize([0.81, 0.83, 0.80]) -> {"mean", "std" (ddof=1), "median", "min", "max", "n"}
  majority_class_baseline(("accuracy",), ("neg", "pos"), train_rows, {"dev": dev_rows})
    -> {"name": "majority class", "prediction": "pos", "dev": {"accuracy": 0.6081}}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _pair(preds: Any, golds: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
  p, g = np.asarray(preds).reshape(-1), np.asarray(golds).reshape(-1)
  if p.shape != g.shape:
    raise ValueError(f"{what}: {p.size} predictions for {g.size} gold values")
  if p.size == 0:
    raise ValueError(f"{what}: no examples")
  return p, g


def accuracy(preds: Any, golds: Any) -> float:
  """Fraction of examples whose predicted class equals the gold class."""
  p, g = _pair(preds, golds, "accuracy")
  return float(np.mean(p == g))


def f1(preds: Any, golds: Any, positive: int = 1) -> float:
  """Binary F1 of class `positive` (GLUE's MRPC/QQP F1); 0.0 when it has no true positive."""
  p, g = _pair(preds, golds, "f1")
  tp = int(np.sum((p == positive) & (g == positive)))
  fp = int(np.sum((p == positive) & (g != positive)))
  fn = int(np.sum((p != positive) & (g == positive)))
  return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def matthews_corr(preds: Any, golds: Any) -> float:
  """Matthews correlation (multi-class R_K, = the binary formula for 2 classes; CoLA's metric).

  0.0 when undefined (only one class predicted or present), as sklearn."""
  p, g = _pair(preds, golds, "matthews_corr")
  classes, idx = np.unique(np.concatenate([g, p]), return_inverse=True)
  k = len(classes)
  conf = np.zeros((k, k), np.float64)  # [gold, pred]
  np.add.at(conf, (idx[: g.size], idx[g.size :]), 1)
  t, pk, c, s = conf.sum(1), conf.sum(0), np.trace(conf), conf.sum()
  cov_pg = c * s - t @ pk
  denom = math.sqrt((s * s - pk @ pk) * (s * s - t @ t))
  return 0.0 if denom == 0 else float(cov_pg / denom)


def pearson(preds: Any, golds: Any) -> float:
  """Pearson correlation; 0.0 when either side is constant (undefined: a collapsed regressor
  ranks as no skill instead of a NaN that breaks best-checkpoint selection)."""
  p, g = _pair(preds, golds, "pearson")
  p, g = p.astype(np.float64) - p.mean(), g.astype(np.float64) - g.mean()
  denom = math.sqrt(float(p @ p) * float(g @ g))
  return 0.0 if denom == 0 else float(p @ g / denom)


def rankdata(x: Any) -> np.ndarray:
  """Ranks 1..n, ties given their average rank (scipy.stats.rankdata's default)."""
  x = np.asarray(x).reshape(-1)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  # Start of each run of equal values; a run's ranks i+1..j average to (i + 1 + j) / 2.
  starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
  ends = np.r_[starts[1:], x.size]
  ranks = np.empty(x.size, np.float64)
  ranks[order] = np.repeat((starts + 1 + ends) / 2, ends - starts)
  return ranks


def spearman(preds: Any, golds: Any) -> float:
  """Spearman rank correlation (Pearson of the tie-averaged ranks)."""
  p, g = _pair(preds, golds, "spearman")
  return pearson(rankdata(p), rankdata(g))


def _flat_tags(preds: Any, golds: Any, what: str) -> tuple[list[Any], list[Any]]:
  """Tag sequences (or flat arrays) -> flat lists, checking sequence lengths match."""
  if len(preds) != len(golds):
    raise ValueError(f"{what}: {len(preds)} predicted sequences for {len(golds)} gold ones")
  p_flat, g_flat = [], []
  for i, (p, g) in enumerate(zip(preds, golds, strict=True)):
    if isinstance(g, str) or np.ndim(g) == 0:  # already flat
      p_flat.append(p)
      g_flat.append(g)
      continue
    if len(p) != len(g):
      raise ValueError(f"{what}: sequence {i} has {len(p)} predicted tags for {len(g)} words")
    p_flat += list(p)
    g_flat += list(g)
  return p_flat, g_flat


def token_accuracy(preds: Any, golds: Any) -> float:
  """Fraction of words tagged correctly, over words that have a gold tag (a gold of None or a
  negative index, e.g. the -1 of label_ids, is skipped). Sequences or flat arrays."""
  p_flat, g_flat = _flat_tags(preds, golds, "token_accuracy")
  pairs = [
    (p, g)
    for p, g in zip(p_flat, g_flat, strict=True)
    if g is not None and not (isinstance(g, int | np.integer) and g < 0)
  ]
  if not pairs:
    raise ValueError("token_accuracy: no word has a gold tag")
  return sum(p == g for p, g in pairs) / len(pairs)


def _split_tag(tag: str) -> tuple[str, str]:
  """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '_'), as seqeval (prefix = first character)."""
  return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def get_entities(seq: Sequence[str]) -> list[tuple[str, int, int]]:
  """Chunks (type, first, last) of a tag sequence, by conlleval's rules as in seqeval's default
  mode: an I- after O or after another type starts a chunk (so IOB1-ish input works), a type
  change ends one, B-/S- always start one and E-/S- (IOBES) end one."""
  chunks = []
  prev_tag, prev_type, begin = "O", "", 0
  for i, chunk in enumerate([*seq, "O"]):
    tag, type_ = _split_tag(chunk)
    typed = prev_tag not in ("O", ".") and prev_type != type_
    if prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O")) or typed:
      chunks.append((prev_type, begin, i - 1))
    typed = tag not in ("O", ".") and prev_type != type_
    if tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I")) or typed:
      begin = i
    prev_tag, prev_type = tag, type_
  return chunks


def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
  """Micro entity precision/recall/F1, equal to seqeval's default (`seqeval.metrics.f1_score(
  gold, pred)` etc.): an entity counts when its type, first and last word all match. 0.0 where
  a ratio is undefined (no entity predicted, none in gold)."""
  if len(gold) != len(pred):
    raise ValueError(f"entity_f1: {len(pred)} predicted sequences for {len(gold)} gold ones")
  flat_g, flat_p = [], []
  for i, (g, p) in enumerate(zip(gold, pred, strict=True)):
    if len(g) != len(p):
      raise ValueError(f"entity_f1: sequence {i} has {len(p)} predicted tags for {len(g)} words")
    # One sequence with an O between sentences, as seqeval: no chunk spans two sentences.
    flat_g += [*g, "O"]
    flat_p += [*p, "O"]
  g_set, p_set = set(get_entities(flat_g)), set(get_entities(flat_p))
  tp, n_pred, n_gold = len(g_set & p_set), len(p_set), len(g_set)
  precision = tp / n_pred if n_pred else 0.0
  recall = tp / n_gold if n_gold else 0.0
  f = 2 * precision * recall / (precision + recall) if tp else 0.0
  return {"precision": precision, "recall": recall, "f1": f}


def is_bio(labels: Sequence[str]) -> bool:
  """Whether a tag set is BIO-like (IOB1/IOB2/IOBES): every tag is O or X-TYPE with X in
  B/I/E/S, and some tag is not O. POS tag sets (NN, IN, ...) are not."""
  tags = [t for t in labels if t != "O"]
  return bool(tags) and all(len(t) > 2 and t[0] in "BIES" and t[1] == "-" for t in tags)


def _entity_metrics(preds: Any, golds: Any) -> dict[str, float]:
  r = entity_f1(golds, preds)
  return {"entity_f1": r["f1"], "entity_precision": r["precision"], "entity_recall": r["recall"]}


# name -> fn(preds, golds, positive) -> float or {name: float}
METRICS: dict[str, Callable[..., float | dict[str, float]]] = {
  "accuracy": lambda p, g, pos: accuracy(p, g),
  "f1": lambda p, g, pos: f1(p, g, pos),
  "mcc": lambda p, g, pos: matthews_corr(p, g),
  "matthews_corr": lambda p, g, pos: matthews_corr(p, g),
  "pearson": lambda p, g, pos: pearson(p, g),
  "spearman": lambda p, g, pos: spearman(p, g),
  "token_accuracy": lambda p, g, pos: token_accuracy(p, g),
  "entity_f1": lambda p, g, pos: _entity_metrics(p, g),
}


def compute(names: Sequence[str], preds: Any, golds: Any, positive: int = 1) -> dict[str, float]:
  """{name: value} for the named metrics. entity_f1 also adds entity_precision and
  entity_recall. `positive` is f1's positive class index."""
  out: dict[str, float] = {}
  for name in names:
    if name not in METRICS:
      raise ValueError(f"unknown metric {name!r} (one of {', '.join(METRICS)})")
    value = METRICS[name](preds, golds, positive)
    out.update(value if isinstance(value, dict) else {name: float(value)})
  return out


def summarize(values: Sequence[float]) -> dict[str, float]:
  """Statistics of one metric over seeds: mean, sample std (ddof=1; 0.0 for one value),
  median, min, max and n."""
  v = np.asarray(values, np.float64).reshape(-1)
  if v.size == 0:
    raise ValueError("summarize: no values")
  return {
    "mean": float(v.mean()),
    "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
    "median": float(np.median(v)),
    "min": float(v.min()),
    "max": float(v.max()),
    "n": int(v.size),
  }


def summarize_seeds(seed_rows: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
  """[{metric: value} per seed] -> {metric: summarize(values)}; every row must have the same
  metrics."""
  if not seed_rows:
    raise ValueError("summarize_seeds: no seeds")
  names = list(seed_rows[0])
  for i, row in enumerate(seed_rows):
    if set(row) != set(names):
      raise ValueError(
        f"summarize_seeds: seed row {i} has metrics {sorted(row)}, not {sorted(names)}"
      )
  return {n: summarize([row[n] for row in seed_rows]) for n in names}


# ----------------------------------------------------------------------------- baselines

# Scores at or below the baseline within this margin count as "at" it (the same counts give
# the same float either way; the margin only absorbs summation order).
BASELINE_EPS = 1e-9


# What a model that learned nothing scores, per task kind (tasks.kinds.Kind.baseline; the
# registry's `baseline(kind, ...)` picks one), to read each fine-tuned score against. Each takes
# (names, labels, train_rows, eval_rows): the task's metrics, its labels, the encoded train rows
# and {split: encoded rows} (tasks.encode: `label`, `label_ids`, `input_ids`), and returns
# {"name", "prediction", split: {metric: value}}, computed as the task's scores are; an
# unlabelled split gets {}.


def no_baseline(names, labels, train_rows, eval_rows) -> dict[str, Any]:
  """Span QA: no trivial answer predictor applies."""
  return {"name": "none", "why": "no trivial answer predictor applies to span QA"}


def chance_baseline(names, labels, train_rows, eval_rows) -> dict[str, Any]:
  """Multiple choice: a uniform guess ("chance": the mean of 1 / choices)."""
  out: dict[str, Any] = {"name": "chance", "prediction": None}
  for split, rows in eval_rows.items():
    labelled = [r for r in rows if int(r["label"]) >= 0]
    chance = float(np.mean([1.0 / np.shape(r["input_ids"])[0] for r in labelled] or [np.nan]))
    out[split] = {"accuracy": chance} if labelled and "accuracy" in names else {}
  return out


def majority_tag_baseline(names, labels, train_rows, eval_rows) -> dict[str, Any]:
  """Tagging: every word gets the train split's most frequent tag ("majority tag")."""
  train = np.concatenate([np.asarray(r["label_ids"]).reshape(-1) for r in train_rows])
  tag = int(np.bincount(train[train >= 0]).argmax())
  out: dict[str, Any] = {"name": "majority tag", "prediction": labels[tag]}
  for split, rows in eval_rows.items():
    golds = [[labels[i] for i in np.asarray(r["label_ids"])[r["label_ids"] >= 0]] for r in rows]
    preds = [[labels[tag]] * len(g) for g in golds]
    out[split] = compute(names, preds, golds) if any(golds) else {}
  return out


def majority_class_baseline(names, labels, train_rows, eval_rows) -> dict[str, Any]:
  """Classification: always the train split's most frequent class ("majority class")."""
  train = np.array([r["label"] for r in train_rows])
  value = int(np.bincount(train[train >= 0].astype(np.int64)).argmax())
  name = {"name": "majority class", "prediction": labels[value] if labels else value}
  return {**name, **_constant_scores(names, value, eval_rows, lambda gold: gold >= 0)}


def train_mean_baseline(names, labels, train_rows, eval_rows) -> dict[str, Any]:
  """Regression: always the train mean ("train mean": a constant correlates 0.0)."""
  train = np.array([r["label"] for r in train_rows])
  value = float(np.mean(train[np.isfinite(train)]))
  name = {"name": "train mean", "prediction": value}
  return {**name, **_constant_scores(names, value, eval_rows, np.isfinite)}


def _constant_scores(names, value, eval_rows, labelled) -> dict[str, dict[str, float]]:
  """Each split's metrics of predicting `value` for every row ({} if a row is unlabelled)."""
  out = {}
  for split, rows in eval_rows.items():
    gold = np.array([r["label"] for r in rows])
    if not labelled(gold).all():
      out[split] = {}
      continue
    out[split] = compute(names, np.full(gold.shape, value, gold.dtype), gold)
  return out


def at_or_below(
  base: dict[str, Any], seed_rows: Sequence[dict[str, float]], split: str, metric: str
) -> list[int]:
  """Indices of the seeds whose `metric` on `split` is at or below the baseline's (every
  metric here is higher-is-better)."""
  b = base.get(split, {}).get(metric)
  if b is None:
    return []
  return [
    k
    for k, row in enumerate(seed_rows)
    if row and metric in row and row[metric] <= b + BASELINE_EPS
  ]


def baseline_note(
  base: dict[str, Any], split: str, metric: str, seeds: Sequence[int], n: int
) -> str:
  """The summary line's tail: '; majority class 0.6081: all 5 seeds at or below it'."""
  if base.get("name") == "none":
    return f"; no baseline ({base['why']})"
  b = base.get(split, {}).get(metric)
  if b is None:
    return ""
  note = f"; {base['name']} {b:.4f}"
  if not seeds:
    return note
  if len(seeds) == n:
    who = {1: "the seed is", 2: "both seeds"}.get(n, f"all {n} seeds")
  else:
    who = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
  return f"{note}: {who} at or below it"
