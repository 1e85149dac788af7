"""Every field of a fine-tuning config (`configs/finetune.py`): its rule, as
bert_jax.config_schema's for the trainer's (the same Rule, ConfigError and cross checks), with
the values only fine-tuning knows (task kinds, file formats, feature rows) read from its task
registry, so the trainer's checks never import it.

  schema.check_finetuning(config)   # python -m bert_jax.finetune's --config
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bert_jax.config_schema import (
  EVERY,
  MESH,
  MODEL,
  OPT,
  PRETRAINING,
  SEED,
  Bool,
  ConfigError,
  Float,
  Int,
  OneOf,
  Rule,
  Str,
  Tuple,
  _within,
  check_config,
)
from bert_jax.tasks import features, kinds, metrics, readers


def _task_kinds() -> tuple:
  return tuple(kinds.KINDS)


def _task_formats() -> tuple:
  return ("auto", *readers.FORMATS)


def _feature_values(name: str) -> Callable[[], tuple]:
  def values() -> tuple:
    value = getattr(features, name)
    return ("", *value) if name == "ROWS" else tuple(value)

  return values


FINETUNING: dict[str, Rule] = {
  "seed": SEED,
  "seeds": Int(1),
  "init": Str(),
  "resume_allow_changes": Str(),
  "task.name": Str(),
  "task.kind": OneOf(_task_kinds),
  "task.format": OneOf(_task_formats),
  "task.train": Str(),
  "task.dev": Str(),
  "task.test": Str(),
  "task.text_fields": Tuple(Str()),
  "task.label_field": Str(),
  "task.tokens_field": Str(),
  "task.tags_field": Str(),
  "task.word_column": Int(),
  "task.tag_column": Int(),
  "task.labels": Tuple(Str()),
  "task.labels_from": OneOf(("train", "all")),
  "task.metrics": Tuple(Str()),  # names: `_cross_finetuning`
  "task.glue_dir": Str(),
  "task.tfds_data_dir": Str(),
  "task.max_examples": Int(0, note="0: every example"),
  "task.max_train_examples": Int(0, note="0: every example"),
  "task.max_eval_examples": Int(0, note="0: every example"),
  "task.files_hint": Str(),
  **_within("model", MODEL),
  "head.bilstm": Bool(),
  "features.row": OneOf(_feature_values("ROWS")),
  "features.layers": Tuple(Int()),
  "features.all_layers": Bool(),
  "features.combine": OneOf(_feature_values("COMBINES")),
  "features.lstm_size": Int(0, note="0: hidden_size // 2"),
  "features.lstm_layers": Int(1),
  "features.dtype": OneOf(_feature_values("DTYPES")),
  "data.max_seq_length": Int(8, 65535),
  "data.buckets": Tuple(Int(1)),
  "data.batch_size": Int(1),
  "data.eval_batch_size": Int(1),
  "data.vocab": Str(),
  **_within("opt", OPT),
  "opt.epochs": Int(1),
  "opt.min_steps": Int(0, note="0: opt.epochs whatever the training set's size"),
  "opt.warmup_fraction": Float(0, 1, high_open=True),
  "grid.lr": Tuple(OPT["lr"]),
  "grid.batch_size": Tuple(Int(1)),
  "grid.epochs": Tuple(Int(1)),
  "squad.doc_stride": Int(1),
  "squad.max_query_length": Int(1),
  "squad.n_best": Int(1),
  "squad.max_answer_length": Int(1),
  "squad.version_2": Bool(),
  "eval.every_steps": Int(0, note="0: after every epoch"),
  **_within("mesh", MESH),
  "ckpt.keep": PRETRAINING["ckpt.keep"],
  "ckpt.async_save": Bool(),
  "log.every_steps": EVERY,
}


def check_finetuning(config: Any) -> None:
  """Every field of a fine-tuning config (`configs/finetune.py`), as `check_pretraining`."""
  check_config(config, FINETUNING, _cross_finetuning, "finetuning")


def _cross_finetuning(v: Mapping[str, Any]) -> None:
  known = (*metrics.METRICS, *kinds.KINDS[v["task.kind"]].metrics)
  for name in v["task.metrics"]:
    if name not in known:
      raise ConfigError(
        f"config.task.metrics: {name!r} is not a metric of a {v['task.kind']} task (one of "
        f"{', '.join(dict.fromkeys(known))})"
      )
  if v["data.max_seq_length"] > v["model.max_position_embeddings"] and not v["init"]:
    raise ConfigError(
      f"config.data.max_seq_length={v['data.max_seq_length']}: must be at most "
      f"config.model.max_position_embeddings={v['model.max_position_embeddings']}"
    )
  for b in v["grid.batch_size"]:
    if b % v["opt.grad_accum_steps"]:
      raise ConfigError(
        f"config.grid.batch_size: {b} must be a multiple of config.opt.grad_accum_steps="
        f"{v['opt.grad_accum_steps']}"
      )
