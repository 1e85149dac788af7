"""The synthetic batch both sides of a comparison time: built here (numpy only, so the peer
interpreter loads this file by path) from a seed, identical arrays for ours and the peer's."""

from __future__ import annotations

import numpy as np

CLS_ID, SEP_ID = 101, 102


def pair_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Full-length sentence pairs, [CLS] A [SEP] B [SEP] with A and B seq/2 tokens each (no
  padding), and a 0/1 label per pair (the NSP label, or the class of a 2-way classifier)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1000, vocab, (batch, seq)).astype(np.int32)
  half = seq // 2
  ids[:, 0], ids[:, half - 1], ids[:, -1] = CLS_ID, SEP_ID, SEP_ID
  seg = np.zeros((batch, seq), np.int32)
  seg[:, half:] = 1
  return {
    "input_ids": ids,
    "segment_ids": seg,
    "input_mask": np.ones((batch, seq), np.int32),
    "label": rng.integers(0, 2, batch).astype(np.int32),
  }
