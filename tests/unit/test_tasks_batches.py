"""bert_jax.tasks.batches: evaluation batches cover every row once and pad with weight 0; training
batches go epoch by epoch and resume at any step."""

import numpy as np

from bert_jax.tasks import batches


def test_batches_cover_every_row_once_and_pad_with_weight_zero():
  rows = [
    {
      "input_ids": np.arange(2, 2 + n, dtype=np.int32),
      "segment_ids": np.zeros(n, np.int32),
      "label": np.int32(n % 2),
    }
    for n in (3, 9, 5, 12, 4)
  ]
  seen = []
  for b in batches.eval_batches(rows, 4, (8, 16), pad_id=0):
    assert b["input_ids"].shape[1] in (8, 16)
    real = b["weight"] > 0
    seen += list(b["row"][real])
    assert (b["row"][~real] == -1).all()
    for i in np.flatnonzero(real):
      n = rows[b["row"][i]]["input_ids"].shape[0]
      assert b["input_mask"][i].sum() == n and (b["input_ids"][i, n:] == 0).all()
  assert sorted(seen) == list(range(5))
  # Training batches: epoch by epoch, each row once per epoch, resumable from any step.
  all_batches = list(zip(range(4), batches.train_batches(rows, 7, 4, 0, (8, 16), 0), strict=False))
  epoch0 = np.concatenate([b["row"][b["weight"] > 0] for _, b in all_batches[:2]])
  assert sorted(epoch0) == list(range(5))
  resumed = next(batches.train_batches(rows, 7, 4, 3, (8, 16), 0))
  np.testing.assert_array_equal(resumed["row"], all_batches[3][1]["row"])
