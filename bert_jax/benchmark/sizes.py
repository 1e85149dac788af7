"""The benchmark's model sizes (`model_config.SIZES` plus the shape of a released checkpoint
the fine-tuning benchmark times, MiniLM-L6-H384: all-MiniLM-L6-v2's encoder), the masked
positions per sequence, and the FLOPs of a step."""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_jax import model as model_lib
from bert_jax import model_config

# The benchmark's own names for sizes model_config.size_fields reads (as the paper names them).
EXTRA_SIZES = {"minilm": "L6_H384_A12"}
SIZES = (*model_config.SIZES, *EXTRA_SIZES)
# Predicted positions per sequence by length (the original BERT's two phases).
MAX_PREDICTIONS = {128: 20, 512: 80}


def max_predictions(seq: int) -> int:
  """Masked positions per sequence of length `seq`."""
  return MAX_PREDICTIONS.get(seq, max(1, round(0.15 * seq)))


def size_fields(name: str) -> dict[str, int]:
  """BertConfig fields for a benchmark size (`model_config.size_fields` of its name)."""
  if name not in SIZES:
    raise ValueError(f"--sizes: unknown size {name!r}; choose from {', '.join(SIZES)}")
  return model_config.size_fields(EXTRA_SIZES.get(name, name))


def config_for_size(name: str, **overrides: Any) -> model_config.BertConfig:
  """A benchmark size's BertConfig."""
  return model_config.BertConfig(**{**size_fields(name), **overrides})


def finetune_flops_per_token(cfg: model_config.BertConfig, seq: int, num_labels: int = 2) -> float:
  """Model FLOPs per token of a sequence-classification train step: the encoder at every
  position (no pruned last layer: nothing is masked) and the pooler + classifier once per
  sequence; no MLM head."""
  full = dataclasses.replace(cfg, prune_last_layer=False)
  nsp_head = 6 * 2 * cfg.hidden_size / seq  # the NSP classifier train_flops_per_token counts
  classifier = 6 * num_labels * cfg.hidden_size / seq
  return model_lib.train_flops_per_token(full, seq, 0) - nsp_head + classifier


def standard_flops_per_token(size: str, seq: int, task: str = "pretrain") -> float:
  """The model FLOPs per token that MFU is quoted in, the same for every implementation: every
  layer at every position (our pruned last layer is not credited), attention included, the
  MLM head at the `max_predictions(seq)` masked positions and the pooler + NSP head once per
  sequence (fine-tuning: pooler + 2-way classifier, no MLM head)."""
  cfg = config_for_size(size, prune_last_layer=False)
  if task == "finetune":
    return finetune_flops_per_token(cfg, seq)
  return model_lib.train_flops_per_token(cfg, seq, max_predictions(seq))
