"""bert_jax.benchmark.memory: the memory record counts params four times and reads XLA's buffers."""

import jax
import jax.numpy as jnp
import pytest

from bert_jax.benchmark import memory


def test_memory_record_counts_params_four_times_and_xla_buffers():
  params = {"w": jnp.zeros((256, 128), jnp.float32), "b": jnp.zeros((128,), jnp.float32)}
  compiled = jax.jit(lambda p: jax.tree.map(lambda x: x * 2, p), donate_argnums=0)
  rec = memory.memory_record(compiled.lower(params).compile(), params)
  n_bytes = 4 * (256 * 128 + 128)
  assert rec["param_gb"] == n_bytes / 1e9 and rec["params_grads_adam_gb"] == 4 * n_bytes / 1e9
  assert rec["xla_argument_gb"] == pytest.approx(n_bytes / 1e9)
  # Donated: the outputs alias the arguments, so the peak counts them once.
  assert rec["xla_alias_gb"] == pytest.approx(n_bytes / 1e9)
  assert rec["xla_peak_gb"] == pytest.approx(
    rec["xla_argument_gb"] + rec["xla_output_gb"] - rec["xla_alias_gb"] + rec["xla_temp_gb"]
  )
  assert rec["xla_peak_gb"] < 1.5 * n_bytes / 1e9
  assert rec["xla_peak_ratio"] == pytest.approx(rec["xla_peak_gb"] / rec["params_grads_adam_gb"])
