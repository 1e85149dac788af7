"""input_pipeline: decoding, epochs, per-process sharding, exact resume, global arrays."""

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import input_pipeline as ip
from bert_jax.data import pretraining as cd

SAMPLE = config_lib.BUNDLED_CORPUS


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("ip") / "data")
  cd.build(
    SAMPLE,
    d,
    max_seq_length=64,
    eval_fraction=0.1,
    num_workers=1,
    progress=False,
    records_per_shard=500,
  )
  return d


def _take(ds, n):
  it = iter(ds)
  return [next(it) for _ in range(n)]


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(data):
  kw = dict(global_batch_size=8, seed=2, process_index=0, process_count=1)
  want = _take(ip.make_dataset(data, "train", **kw), 4)
  got = _take(ip.make_dataset(data, "train", worker_count=2, **kw), 4)
  for w, g in zip(want, got, strict=True):
    np.testing.assert_array_equal(w["example_id"], g["example_id"])
    np.testing.assert_array_equal(w["input_ids"], g["input_ids"])
