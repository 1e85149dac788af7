"""The task kinds, defined once: each kind's head, loss, predictions, score and HF class.

  kind             head reads          head         outputs         HF class (BertFor...)
  classification   pooled [CLS]        classifier   one per label   SequenceClassification
  regression       pooled [CLS]        classifier   1 (a value)     SequenceClassification
  tagging          every token         classifier   one per tag     TokenClassification
  span_qa          every token         qa_outputs   2 (start, end)  QuestionAnswering
  multiple_choice  pooled, per choice  classifier   1 (per choice)  MultipleChoice

The model (heads.py), the fine-tuning interface (`bert_jax.tasks.Task`) and the readers read
their per-kind choices from `KINDS` instead of testing kind names; a kind's head as checkpoints
hold it (output Dense, output count, HF class) is `Kind.hf`, from `bert_jax.interop.hf_heads`,
which reads checkpoints without this module. Losses return (summed loss, count) so gradient
accumulation divides by the whole batch's count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bert_jax.interop import hf_heads
from bert_jax.tasks import metrics as metrics_lib

Batch = dict[str, Array]

TASK_FILE = hf_heads.TASK_FILE  # a fine-tuned model's or feature head's task (task.json)


def _ce(logits: Array, labels: Array) -> Array:
  """Cross-entropy per position; labels < 0 give 0 (their weight is 0 anyway)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  safe = jnp.maximum(labels, 0)
  return -jnp.take_along_axis(logp, safe[..., None], -1)[..., 0]


# ----------------------------------------------------------------------- device side (jit-able)


def _class_loss(logits: Array, batch: Batch) -> tuple[Array, Array]:
  w = batch["weight"]
  return jnp.sum(_ce(logits, batch["label"]) * w), jnp.sum(w)


def _squared_error(logits: Array, batch: Batch) -> tuple[Array, Array]:
  w = batch["weight"]
  err = logits[:, 0] - batch["label"].astype(jnp.float32)
  return jnp.sum(jnp.square(err) * w), jnp.sum(w)


def _tag_loss(logits: Array, batch: Batch) -> tuple[Array, Array]:
  tw = (batch["label_ids"] >= 0) * batch["weight"][:, None]
  return jnp.sum(_ce(logits, batch["label_ids"]) * tw), jnp.sum(tw)


def _span_loss(logits: Array, batch: Batch) -> tuple[Array, Array]:
  w = batch["weight"]
  start = _ce(logits[..., 0], batch["start_positions"])
  end = _ce(logits[..., 1], batch["end_positions"])
  return jnp.sum(0.5 * (start + end) * w), jnp.sum(w)


def _rows(batch: Batch) -> Array:
  return jnp.sum(batch["weight"])


def _tagged_tokens(batch: Batch) -> Array:
  return jnp.sum((batch["label_ids"] >= 0) * batch["weight"][:, None])


def _argmax(logits: Array) -> dict[str, Array]:
  return {"pred": jnp.argmax(logits, -1).astype(jnp.int32)}


def _value(logits: Array) -> dict[str, Array]:
  return {"pred": logits[:, 0]}


def _span_logits(logits: Array) -> dict[str, Array]:
  return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}


# ----------------------------------------------------------------------- host side


def _score_rows(task: Any, preds: dict, rows: list, labelled: Callable) -> dict[str, float]:
  """One label per row; {} for an unlabelled split (as GLUE's test files)."""
  gold = np.array([r["label"] for r in rows])
  pred = np.array(preds["pred"])
  known = labelled(gold)
  if not known.all():
    if known.any():
      raise ValueError(f"task {task.name}: a split mixes labelled and unlabelled rows")
    return {}
  return metrics_lib.compute(task.metrics, pred, gold)


def _score_classes(task: Any, preds: dict, rows: list, extra: Any) -> dict[str, float]:
  return _score_rows(task, preds, rows, lambda gold: gold >= 0)  # -1: no label


def _score_values(task: Any, preds: dict, rows: list, extra: Any) -> dict[str, float]:
  return _score_rows(task, preds, rows, np.isfinite)  # NaN: no label


def _score_tags(task: Any, preds: dict, rows: list, extra: Any) -> dict[str, float]:
  gold_tags, pred_tags = [], []
  for row, p in zip(rows, preds["pred"], strict=True):
    at = row["label_ids"] >= 0
    gold_tags.append([task.labels[i] for i in row["label_ids"][at]])
    pred_tags.append([task.labels[i] for i in p[at]])
  if not any(gold_tags):
    return {}  # an unlabelled split
  return metrics_lib.compute(task.metrics, pred_tags, gold_tags)


def _score_spans(task: Any, preds: dict, rows: list, extra: Any) -> dict[str, float]:
  return extra.score(preds["start_logits"], preds["end_logits"])  # a tasks.QAInfo


# What an unlabelled split's predictions file holds per example
# (bert_jax.finetune.seed.write_split_predictions).


def _class_name(task: Any, pred: Any, row: dict) -> Any:
  return task.labels[int(pred)]


def _number(task: Any, pred: Any, row: dict) -> Any:
  return float(pred)


def _choice(task: Any, pred: Any, row: dict) -> Any:
  return int(pred)


def _word_tags(task: Any, pred: Any, row: dict) -> Any:
  # Each word's first sub-token carries a tag index, or UNKNOWN_TAG where the split has none.
  return [task.labels[int(p)] for p in pred[np.asarray(row["label_ids"]) != -1]]


# ----------------------------------------------------------------------- the registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kind:
  """What one task kind does, everywhere it differs from the others (defaults: a sentence
  classifier's)."""

  name: str
  metrics: tuple[str, ...]  # the default metrics, main first (tagging's entity_f1: BIO only)
  loss: Callable[[Array, Batch], tuple[Array, Array]]  # (summed loss, count)
  score: Callable[..., dict[str, float]]  # (task, preds, rows, extra) -> a split's metrics
  pooled: bool = True  # the head reads the pooled [CLS] (else every token)
  head_dropout: bool = True  # dropout before the head (HF's QA head has none)
  choices: bool = False  # a row holds C choices ([B, C, L]) and the logits score each
  value_label: bool = False  # the label is a number (NaN when unknown), not a class index
  examples: str = "text"  # what reads its files: "text" or "tagged" (readers), "squad" (squad)
  count: Callable[[Batch], Array] = _rows  # the loss's count of a whole batch
  predict: Callable[[Array], dict[str, Array]] = _argmax  # per-row predictions for the host
  # What a model that learned nothing scores (tasks.metrics' *_baseline functions).
  baseline: Callable[..., dict[str, Any]] = metrics_lib.majority_class_baseline
  # (task, a row's prediction, the row) -> the JSON value an unlabelled split's predictions
  # file holds (a class name, a number, an ending's index, a tag per word); None: the kind
  # writes its own (span QA: the official predictions JSON).
  prediction: Callable[[Any, Any, dict], Any] | None = _class_name

  @property
  def hf(self) -> hf_heads.Head:
    """Its head as checkpoints hold it: output Dense, output count, HF class (hf_heads.HEADS)."""
    return hf_heads.HEADS[self.name]

  @property
  def head(self) -> str:
    return self.hf.name

  @property
  def outputs(self) -> int | None:
    return self.hf.outputs

  @property
  def labelled(self) -> bool:
    """Whether the outputs are named by the task's labels (classes or tags)."""
    return self.hf.labelled

  def num_outputs(self, labels: Sequence[str]) -> int:
    return self.hf.num_outputs(labels)


KINDS: dict[str, Kind] = {
  k.name: k
  for k in (
    Kind(
      name="classification",
      metrics=("accuracy",),
      loss=_class_loss,
      score=_score_classes,
    ),
    Kind(
      name="regression",
      value_label=True,
      metrics=("pearson", "spearman"),
      loss=_squared_error,
      predict=_value,
      score=_score_values,
      prediction=_number,
      baseline=metrics_lib.train_mean_baseline,
    ),
    Kind(
      name="tagging",
      pooled=False,
      examples="tagged",
      metrics=("entity_f1", "token_accuracy"),
      loss=_tag_loss,
      count=_tagged_tokens,
      score=_score_tags,
      prediction=_word_tags,
      baseline=metrics_lib.majority_tag_baseline,
    ),
    Kind(
      name="span_qa",
      pooled=False,
      head_dropout=False,
      examples="squad",
      metrics=("f1", "exact_match"),
      loss=_span_loss,
      predict=_span_logits,
      score=_score_spans,
      prediction=None,
      baseline=metrics_lib.no_baseline,
    ),
    Kind(
      name="multiple_choice",
      choices=True,
      metrics=("accuracy",),
      loss=_class_loss,
      score=_score_classes,
      prediction=_choice,
      baseline=metrics_lib.chance_baseline,
    ),
  )
}


def get(kind: Any, source: str = "task.kind") -> Kind:
  """The kind named `kind`; anything else is one line naming `source`."""
  if not isinstance(kind, str) or kind not in KINDS:
    raise ValueError(f"{source}: unknown task kind {kind!r} (one of {', '.join(KINDS)})")
  return KINDS[kind]


def baseline(
  kind: str,
  names: Sequence[str],
  labels: Sequence[str],
  train_rows: Sequence[dict[str, Any]],
  eval_rows: dict[str, Sequence[dict[str, Any]]],
) -> dict[str, Any]:
  """What a model that learned nothing scores on each split, for a task kind (`Kind.baseline`:
  majority class, majority tag, train mean, chance, or none for span QA)."""
  return get(kind).baseline(names, labels, train_rows, eval_rows)


def default_metrics(kind: str, labels: Sequence[str] = ()) -> tuple[str, ...]:
  """The metrics of a task kind (main metric first); entity_f1 only for BIO tags."""
  if kind not in KINDS:
    raise ValueError(f"no default metrics for task kind {kind!r} (one of {', '.join(KINDS)})")
  names = KINDS[kind].metrics
  if "entity_f1" in names and not metrics_lib.is_bio(labels):
    names = tuple(n for n in names if n != "entity_f1")
  return names
