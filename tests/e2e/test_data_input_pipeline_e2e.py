"""The end-to-end half of tests/unit/test_data_input_pipeline.py (real processes; slow): see its
docstring."""

import numpy as np
import pytest
from unit import test_data_input_pipeline as unit_data_input_pipeline
from unit.test_data_input_pipeline import _take

from bert_jax.data import input_pipeline as ip

# The unit half's fixture, shared here.
data = unit_data_input_pipeline.data


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(data):
  kw = dict(global_batch_size=8, seed=2, process_index=0, process_count=1)
  want = _take(ip.make_dataset(data, "train", **kw), 4)
  got = _take(ip.make_dataset(data, "train", worker_count=2, **kw), 4)
  for w, g in zip(want, got, strict=True):
    np.testing.assert_array_equal(w["example_id"], g["example_id"])
    np.testing.assert_array_equal(w["input_ids"], g["input_ids"])
