"""bert_jax.benchmark.measure: the --large measurement path on a tiny model."""

import pytest

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax.benchmark import (
  measure,
  memory,
)


def test_large_measurement_path_on_a_tiny_model():
  """--large's measurement (scanned layers, full remat, XLA's memory accounting), at tiny."""
  spec = {**memory.large_spec(batch=2), "size": "tiny", "seq": 32}
  rec = measure.measure_ours(**spec)
  assert rec["variant"] == memory.LARGE_VARIANT and len(rec["step_s"]) == 2
  assert "mfu" not in rec  # no matmul peak for this one
  n_params = model_lib.count_params(model_lib.abstract_params(model_config.config_for_size("tiny")))
  assert rec["param_gb"] == pytest.approx(4 * n_params / 1e9)
  # The state (params + 2 Adam moments) is an argument; the peak holds at least it.
  assert rec["xla_argument_gb"] >= 3 * rec["param_gb"]
  assert rec["xla_peak_gb"] >= rec["xla_argument_gb"]
  assert rec["peak_rss_ratio"] == rec["peak_rss_gb"] / rec["params_grads_adam_gb"]
