"""Fine-tuning batches: length-bucketed, seeded epochs of task rows, and whole eval splits.

Every process builds the same global batch and keeps its own rows (`host_slice`). A batch is
padded to the smallest bucket (`buckets`) that holds its longest row, so a step compiles once
per bucket; the last partial batch of an epoch or split is filled with weight-0 copies of its
first row, never dropped.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import jax
import ml_collections
import numpy as np

MODEL_INPUTS = ("input_ids", "segment_ids", "input_mask")


def model_inputs(model) -> tuple[str, ...]:
  """The batch fields a model takes (the feature-based tagger: features, input_mask)."""
  return getattr(model, "inputs", MODEL_INPUTS)


def buckets(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  max_len = config.data.max_seq_length
  return tuple(sorted({b for b in config.data.buckets if b < max_len} | {max_len}))


def bucket_length(length: int, bucket_lengths: tuple[int, ...]) -> int:
  return next((b for b in bucket_lengths if b >= length), bucket_lengths[-1])


def collate(
  rows: list[dict[str, np.ndarray]],
  indices: np.ndarray,
  batch_size: int,
  bucket_lengths,
  pad_id: int,
) -> dict[str, np.ndarray]:
  """Rows at `indices` (fewer than batch_size: filled with weight-0 copies of the first) as
  one batch padded to its bucket length; adds input_mask, weight and row."""
  real = len(indices)
  idx = np.concatenate([indices, np.full(batch_size - real, indices[0])]).astype(np.int64)
  picked = [rows[i] for i in idx]
  length = bucket_length(max(r["input_ids"].shape[-1] for r in picked), bucket_lengths)
  pads = {"input_ids": pad_id, "segment_ids": 0, "label_ids": -1}
  batch: dict[str, np.ndarray] = {}
  for key in picked[0]:
    if key in pads:
      out = np.full((batch_size, *picked[0][key].shape[:-1], length), pads[key], np.int32)
      for i, r in enumerate(picked):
        out[i, ..., : r[key].shape[-1]] = r[key]
      batch[key] = out
    elif key == "features":  # frozen-encoder features [L_row, K, D]: pad the length axis
      out = np.zeros((batch_size, length, *picked[0][key].shape[1:]), picked[0][key].dtype)
      for i, r in enumerate(picked):
        out[i, : len(r[key])] = r[key]
      batch[key] = out
    elif key not in ("n_words",):
      batch[key] = np.stack([np.asarray(r[key]) for r in picked])
  lengths = np.array([r["input_ids"].shape[-1] for r in picked])
  mask = np.arange(length) < lengths.reshape(-1, *([1] * (batch["input_ids"].ndim - 1)))
  if batch["input_ids"].ndim == 3:  # multiple choice: each choice row has its own length
    mask = batch["input_ids"] != pad_id
    mask[..., 0] = True
  batch["input_mask"] = mask.astype(np.int32)
  batch["weight"] = (np.arange(batch_size) < real).astype(np.float32)
  batch["row"] = np.where(np.arange(batch_size) < real, idx, -1).astype(np.int32)
  return batch


def host_slice(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's rows of a global batch (every process builds the same global batch)."""
  n, p = jax.process_count(), jax.process_index()
  b = len(batch["weight"]) // n
  return {k: v[p * b : (p + 1) * b] for k, v in batch.items()}


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n)


def train_batches(rows, seed, batch_size, start_step, bucket_lengths, pad_id) -> Iterator:
  """Epoch after epoch of shuffled batches (the last partial one kept), from `start_step`."""
  per_epoch = math.ceil(len(rows) / batch_size)
  for step in itertools.count(start_step):
    epoch, i = divmod(step, per_epoch)
    order = epoch_order(seed, epoch, len(rows))
    yield collate(
      rows, order[i * batch_size : (i + 1) * batch_size], batch_size, bucket_lengths, pad_id
    )


def eval_batches(rows, batch_size, bucket_lengths, pad_id) -> Iterator:
  """Every row once, grouped by length so batches pad little."""
  order = np.argsort([r["input_ids"].shape[-1] for r in rows], kind="stable")
  for i in range(0, len(rows), batch_size):
    yield collate(rows, order[i : i + batch_size], batch_size, bucket_lengths, pad_id)
