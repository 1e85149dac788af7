"""Fine-tuning tasks: what each task kind's head computes, its loss, its predictions and its
metrics. The loop (bert_jax.finetune) only sees this interface, so span QA, multiple choice
and the frozen-feature mode plug in here.

  readers  files -> examples (JSONL/CSV/TSV, GLUE layout, local TFDS, CoNLL)
  encode   examples -> unpadded model rows (input_ids, segment_ids, labels)
  squad    SQuAD JSON -> windows; n-best decoding; the official EM/F1
  metrics  host-side metrics and seed statistics
  heads    FinetuneModel = BertModel + one head

Batches carry, besides the model inputs, `weight` (1 for a real row, 0 for the padding rows
that fill the last batch) and `row` (the row's index in its split, -1 for padding).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from bert_jax.tasks.heads import KINDS, FinetuneModel  # noqa: F401  (re-exported)

# Per kind: the label fields a row carries (padded to the bucket length when per token).
LABEL_FIELDS = {
  "classification": ("label",),
  "regression": ("label",),
  "tagging": ("label_ids",),
  "span_qa": ("start_positions", "end_positions"),
  "multiple_choice": ("label",),
}


def _ce(logits: Array, labels: Array) -> Array:
  """Cross-entropy per position; labels < 0 give 0 (their weight is 0 anyway)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  safe = jnp.maximum(labels, 0)
  return -jnp.take_along_axis(logp, safe[..., None], -1)[..., 0]


@dataclasses.dataclass
class QAInfo:
  """What span-QA scoring needs besides the logits: the examples and each row's window, the
  decoding settings (config.squad) and the reader's offset check; `predictions` holds the last
  scored split's answers (the run writes them as the official predictions.json)."""

  examples: list
  metas: list
  stats: dict
  tokenizer: Any
  doc_stride: int = 128
  max_query_length: int = 64
  n_best: int = 20
  max_answer_length: int = 30
  version_2: bool = False
  predictions: dict | None = None

  def score(self, start_logits: list, end_logits: list) -> dict[str, float]:
    """EM/F1 in percent (official v1.1; v2: at the best no-answer threshold, reported)."""
    from bert_jax.tasks import squad

    gold = {e.qid: list(e.answers) for e in self.examples}
    kw = dict(
      n_best=self.n_best, max_answer_length=self.max_answer_length, tokenizer=self.tokenizer
    )
    if not self.version_2:
      self.predictions, _ = squad.decode(self.examples, self.metas, start_logits, end_logits, **kw)
      return squad.squad_v1_score(gold, self.predictions)
    preds, diffs = squad.decode(
      self.examples,
      self.metas,
      start_logits,
      end_logits,
      version_2=True,
      null_threshold=float("inf"),
      **kw,
    )
    threshold, scores = squad.squad_v2_best_threshold(gold, preds, diffs)
    self.predictions = squad.apply_null_threshold(preds, diffs, threshold)
    return {**scores, "null_threshold": float(threshold)}


@dataclasses.dataclass(frozen=True)
class Task:
  """A task kind with its label names (classes or tags, index order; () for regression,
  QA and multiple choice) and its metrics (the first is the one dev selection uses)."""

  name: str
  kind: str
  labels: tuple[str, ...]
  metrics: tuple[str, ...]

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"task.kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
    if self.kind in ("classification", "tagging") and len(self.labels) < 2:
      raise ValueError(f"task {self.name}: a {self.kind} task needs >= 2 labels: {self.labels}")

  @property
  def main_metric(self) -> str:
    return self.metrics[0]

  @property
  def num_outputs(self) -> int:
    if self.kind in ("classification", "tagging"):
      return len(self.labels)
    return 2 if self.kind == "span_qa" else 1

  def model(self, cfg, bilstm: bool = False) -> FinetuneModel:
    return FinetuneModel(cfg, self.kind, self.num_outputs, bilstm)

  # --------------------------------------------------------------- device side (jit-able)

  def losses(self, logits: Array, batch: dict[str, Array]) -> tuple[Array, Array]:
    """(summed loss, count) of a batch: the loss is their ratio, and with gradient
    accumulation the count comes from the whole batch."""
    w = batch["weight"]
    if self.kind in ("classification", "multiple_choice"):
      return jnp.sum(_ce(logits, batch["label"]) * w), jnp.sum(w)
    if self.kind == "regression":
      err = logits[:, 0] - batch["label"].astype(jnp.float32)
      return jnp.sum(jnp.square(err) * w), jnp.sum(w)
    if self.kind == "tagging":
      tw = (batch["label_ids"] >= 0) * w[:, None]
      return jnp.sum(_ce(logits, batch["label_ids"]) * tw), jnp.sum(tw)
    start = _ce(logits[..., 0], batch["start_positions"])
    end = _ce(logits[..., 1], batch["end_positions"])
    return jnp.sum(0.5 * (start + end) * w), jnp.sum(w)

  def count(self, batch: dict[str, Array]) -> Array:
    if self.kind == "tagging":
      return jnp.sum((batch["label_ids"] >= 0) * batch["weight"][:, None])
    return jnp.sum(batch["weight"])

  def predict(self, logits: Array) -> dict[str, Array]:
    """Per-row predictions an evaluation gathers to the host."""
    if self.kind == "regression":
      return {"pred": logits[:, 0]}
    if self.kind == "span_qa":
      return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
    return {"pred": jnp.argmax(logits, -1).astype(jnp.int32)}

  # --------------------------------------------------------------- host side

  def score(
    self, preds: dict[str, list[np.ndarray]], rows: list[dict[str, np.ndarray]], extra: Any = None
  ) -> dict[str, float]:
    """Metrics of a whole split: `preds[key][i]` is row i's prediction (trimmed to its length
    for per-token keys), `rows` the encoded rows (gold labels), `extra` what the kind needs
    besides (span QA: the examples and window metadata)."""
    from bert_jax.tasks import metrics

    if self.kind == "span_qa":
      return extra.score(preds["start_logits"], preds["end_logits"])
    if self.kind == "tagging":
      gold_tags, pred_tags = [], []
      for row, p in zip(rows, preds["pred"], strict=True):
        at = row["label_ids"] >= 0
        gold_tags.append([self.labels[i] for i in row["label_ids"][at]])
        pred_tags.append([self.labels[i] for i in p[at]])
      if not any(gold_tags):
        return {}  # an unlabelled split
      return metrics.compute(self.metrics, pred_tags, gold_tags)
    gold = np.array([r["label"] for r in rows])
    pred = np.array(preds["pred"])
    labelled = gold >= 0 if self.kind != "regression" else np.isfinite(gold)
    if not labelled.all():
      if labelled.any():
        raise ValueError(f"task {self.name}: a split mixes labelled and unlabelled rows")
      return {}
    return metrics.compute(self.metrics, pred, gold)
