"""bert_jax.data.writer: chunks are random samples of an ordered corpus."""

import os

import numpy as np

from bert_jax.data import writer as data_writer


def test_chunks_are_random_samples_of_an_ordered_corpus(tmp_path, monkeypatch):
  """Chunks must mix the corpus even when a bucket holds many chunks in corpus order.

  The NSP "other document" comes from the chunk; chunks cut from one stretch of an ordered
  corpus (one source) gave fewer short sequences than the original's whole-corpus draw.
  """
  # Buckets of ~5 chunks, as on a corpus of > 16 GB.
  monkeypatch.setattr(data_writer, "MAX_BUCKETS", 2)
  docs = [[f"{'alpha' if d < 200 else 'beta'} {d} " + "x" * 190] for d in range(400)]
  scatter = data_writer.Scatter(str(tmp_path), 80_000, 0.0, 8_000, seed=3)
  scatter.scatter(iter(docs))
  assert scatter.num_buckets["train"] == 2
  units = list(scatter.units("train"))
  seen = sorted(int(doc[0].split()[1]) for u in units for doc in u.docs)
  assert seen == list(range(400)) and [u.index for u in units] == list(range(len(units)))
  assert len(units) >= 8
  for u in units[:-1]:  # the last one may be tiny
    alpha = np.mean([doc[0].startswith("alpha") for doc in u.docs])
    assert 0.2 < alpha < 0.8, (u.index, alpha)
  assert os.listdir(tmp_path) == []  # buckets are removed once read
