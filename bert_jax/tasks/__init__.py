"""Fine-tuning tasks: what each task kind's head computes, its loss, its predictions and its
metrics. The loop (bert_jax.finetune) only sees this interface, so span QA, multiple choice
and the frozen-feature mode plug in here.

  readers  files -> examples (JSONL/CSV/TSV, GLUE layout, local TFDS, CoNLL)
  formats  each file format's rows -> examples, one-line errors naming file:line
  encode   examples -> unpadded model rows (input_ids, segment_ids, labels)
  squad    SQuAD JSON -> windows; n-best decoding; the official EM/F1
  metrics  host-side metrics and seed statistics
  heads    FinetuneModel = BertModel + one head
  kinds    the task kinds: each one's head, loss, predictions, score and HF class

Batches carry, besides the model inputs, `weight` (1 for a real row, 0 for the padding rows
that fill the last batch) and `row` (the row's index in its split, -1 for padding).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax import Array

from bert_jax.tasks import kinds
from bert_jax.tasks.heads import FinetuneModel


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
    spec = kinds.get(self.kind)
    if spec.labelled and len(self.labels) < 2:
      raise ValueError(f"task {self.name}: a {self.kind} task needs >= 2 labels: {self.labels}")

  @property
  def spec(self) -> kinds.Kind:
    return kinds.KINDS[self.kind]

  @property
  def main_metric(self) -> str:
    return self.metrics[0]

  @property
  def num_outputs(self) -> int:
    return self.spec.num_outputs(self.labels)

  def model(self, cfg, bilstm: bool = False) -> FinetuneModel:
    return FinetuneModel(cfg, self.kind, self.num_outputs, bilstm)

  # --------------------------------------------------------------- device side (jit-able)

  def losses(self, logits: Array, batch: dict[str, Array]) -> tuple[Array, Array]:
    """(summed loss, count) of a batch: the loss is their ratio, and with gradient
    accumulation the count comes from the whole batch."""
    return self.spec.loss(logits, batch)

  def count(self, batch: dict[str, Array]) -> Array:
    return self.spec.count(batch)

  def predict(self, logits: Array) -> dict[str, Array]:
    """Per-row predictions an evaluation gathers to the host."""
    return self.spec.predict(logits)

  # --------------------------------------------------------------- host side

  def score(
    self, preds: dict[str, list[np.ndarray]], rows: list[dict[str, np.ndarray]], extra: Any = None
  ) -> dict[str, float]:
    """Metrics of a whole split: `preds[key][i]` is row i's prediction (trimmed to its length
    for per-token keys), `rows` the encoded rows (gold labels), `extra` what the kind needs
    besides (span QA: the examples and window metadata)."""
    return self.spec.score(self, preds, rows, extra)
