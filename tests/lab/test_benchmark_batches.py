"""bert_jax.benchmark.batches: the pair batch is the batch of both sides."""

import numpy as np

from bert_jax.benchmark import (
  batches,
  peer_worker,
  step,
)


def test_pair_batch_is_the_batch_of_both_sides():
  b = batches.pair_batch(3, 8, 30522, seed=5)
  assert b["input_ids"].shape == (3, 8) and b["input_ids"].dtype == np.int32
  assert (b["input_ids"][:, [0, 3, 7]] == [101, 102, 102]).all()
  assert (b["segment_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]).all() and b["input_mask"].all()
  assert set(b["label"]) <= {0, 1} and b["label"].shape == (3,)
  again = batches.pair_batch(3, 8, 30522, seed=5)
  assert all((b[k] == again[k]).all() for k in b)
  # The pretraining step times the same arrays (its NSP label is the pair's label), and the
  # peer worker builds its fine-tuning batch with this very function.
  pre = step.synthetic_batch(3, 8, 30522, seed=5)
  assert (pre["input_ids"] == b["input_ids"]).all() and (
    pre["next_sentence_label"] == b["label"]
  ).all()
  assert peer_worker.batches.pair_batch is batches.pair_batch
