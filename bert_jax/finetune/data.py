"""A fine-tuning run's task data: every split read, encoded and held as a named `Split`.

The task kind's registry entry (`tasks.kinds.Kind.examples`) names what reads its files, and
`READERS` maps that name to the reader: "text" and "tagged" (tasks.readers, then tasks.encode)
or "squad" (tasks.squad: SQuAD JSON, doc-stride windows, and the QAInfo its scoring needs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import ml_collections

from bert_jax import loop
from bert_jax import tasks as tasks_lib
from bert_jax.data import corpus
from bert_jax.runtime import files
from bert_jax.tasks import encode, kinds, readers, squad
from bert_jax.tasks.encode import Encoded

SPLITS = ("train", "dev", "test")


class Split(NamedTuple):
  """One split of a task: its examples in file order, their encoded model rows and, for span
  QA, what scoring needs besides the logits (`qa`: the windows, the decoding settings)."""

  examples: list
  encoded: Encoded
  qa: tasks_lib.QAInfo | None = None
  files: tuple[str, ...] = ()  # what it was read from (a rerun compares their content)

  @property
  def rows(self) -> list[dict[str, Any]]:
    return self.encoded.rows

  @property
  def state(self) -> str:
    """'unlabelled' (a test split without labels: predictions, no metrics) or 'labelled'. The
    readers refuse a split labelled in some rows only."""
    first = self.examples[0]
    unlabelled = getattr(first, "label", 0) is None or getattr(first, "tags", 0) is None
    return "unlabelled" if unlabelled else "labelled"


Splits = dict[str, Split | None]


def split_state(split: Split | None) -> str:
  """'absent' (no file), else the split's `state`."""
  return "absent" if split is None else split.state


def _limit(task: ml_collections.ConfigDict, split: str) -> int:
  return task.max_train_examples if split == "train" else task.max_eval_examples


def _text_splits(config: ml_collections.ConfigDict, tokenizer) -> tuple[tasks_lib.Task, Splits]:
  """Sentences, pairs, choices and tagged sentences (tasks.readers), encoded (tasks.encode)."""
  t = config.task
  examples = {
    s: readers.read_split(t, s) if readers.has_split(t, s) or s == "train" else None for s in SPLITS
  }
  for s in SPLITS:
    if _limit(t, s) and examples[s] is not None:
      examples[s] = examples[s][: _limit(t, s)]
  # brown_pos's dev and test hold a few rare tags train lacks: task.labels_from="all" takes
  # the label set from every split (otherwise an unseen dev/test label is an error).
  extra = [examples[s] for s in ("dev", "test") if examples[s]] if t.labels_from == "all" else []
  labels = tuple(readers.label_list(t, examples["train"], extra))
  for s in SPLITS:
    if examples[s] is not None and labels:
      readers.check_labels(examples[s], labels, s)
  names = tuple(t.metrics) or kinds.default_metrics(t.kind, labels)
  task = tasks_lib.Task(t.name, t.kind, labels, names)
  splits: Splits = {}
  for s in SPLITS:
    if examples[s] is None:
      splits[s] = None
      continue
    enc = encode.encode(examples[s], t.kind, tokenizer, config.data.max_seq_length, labels)
    splits[s] = Split(examples[s], enc, None, tuple(readers.split_files(t, s)))
  return task, splits


def _squad_splits(config: ml_collections.ConfigDict, tokenizer) -> tuple[tasks_lib.Task, Splits]:
  """SQuAD v1.1/v2.0 JSON (a split may list several files, comma-separated) as doc-stride
  windows; a test split that is the dev file (squadshifts' held-out domain) is read once."""
  t = config.task
  splits: Splits = {}
  for split in SPLITS:
    if not t[split]:
      splits[split] = None
      continue
    if split == "test" and t.test == t.dev:
      splits[split] = splits["dev"]
      continue
    examples, stats = squad.read_squad(t[split].split(","), t.max_examples)
    if _limit(t, split):
      examples = examples[: _limit(t, split)]
    enc, metas = squad.encode_squad(
      examples,
      tokenizer,
      config.data.max_seq_length,
      config.squad.doc_stride,
      config.squad.max_query_length,
      training=split == "train",
    )
    qa = tasks_lib.QAInfo(examples, metas, stats, tokenizer, **config.squad.to_dict())
    splits[split] = Split(examples, enc, qa, tuple(p for p in t[split].split(",") if p))
  task = tasks_lib.Task(t.name, t.kind, (), tuple(t.metrics) or kinds.default_metrics(t.kind))
  return task, splits


# What reads a task kind's files, by its registry entry's `Kind.examples`.
READERS: dict[str, Callable[[ml_collections.ConfigDict, Any], tuple[tasks_lib.Task, Splits]]] = {
  "text": _text_splits,
  "tagged": _text_splits,
  "squad": _squad_splits,
}


def load_task_data(config: ml_collections.ConfigDict, tokenizer) -> tuple[tasks_lib.Task, Splits]:
  """Reads and encodes every split of `config.task`: (Task, {split: Split, or None}), and says
  what it read in one line: 'custom (tagging): train 96, dev 32 (2 truncated), ...'."""
  t0 = time.perf_counter()
  task, splits = READERS[kinds.get(config.task.kind).examples](config, tokenizer)
  parts = [
    f"{s} {len(d.examples)}"
    + (f" ({d.encoded.n_truncated} truncated)" if d.encoded.n_truncated else "")
    for s, d in splits.items()
    if d
  ]
  seconds = time.perf_counter() - t0
  loop.console(f"{task.name} ({task.kind}): {', '.join(parts)}; encoded in {seconds:.1f}s")
  return task, splits


def check_task_files(task: ml_collections.ConfigDict) -> None:
  """One line, before any checkpoint is read, for a task file that is not there: a preset's
  line says where its files come from (`task.files_hint`). A dev split is required (best-point
  selection); a test split may be absent (dev is reported alone)."""
  for split in SPLITS:
    for path in filter(None, (task[split] or "").split(",")):
      if not files.is_remote(path) and not os.path.exists(path):
        hint = task.get("files_hint", "")
        raise FileNotFoundError(f"{path}: no such file" + (f"; {hint}" if hint else ""))
  if not task.dev and task.get("format", "auto") not in ("glue", "tfds"):
    raise ValueError(f"task {task.name}: no dev split (config.task.dev) to select on")


def fingerprints(data: Splits) -> dict[str, dict[str, Any]]:
  """{split: {"files": the files it was read from, "sha256": their content}} (a rerun compares
  contents, not paths: the same file elsewhere is the same input)."""
  return {
    s: {"files": list(d.files), "sha256": corpus.content_sha256(list(d.files))}
    for s, d in data.items()
    if d is not None and d.files
  }


def offsets(data: Splits) -> dict[str, Any]:
  """Span QA's answer-offset check per split (tasks.squad.read_squad's stats), or {}."""
  return {s: d.qa.stats for s, d in data.items() if d and d.qa is not None}
