"""BERT-Large's train step: compile time and memory, XLA's buffer accounting against the
parameters + gradients + Adam moments that any step must hold."""

from __future__ import annotations

from typing import Any

import jax

# Scanned layers (compile time independent of depth) and full remat, as a large run trains.
LARGE_VARIANT: dict[str, Any] = {"scan_layers": True, "remat_policy": "full"}


def large_spec(batch: int) -> dict[str, Any]:
  """The `step.measure_ours` arguments of the BERT-Large memory measurement."""
  return dict(
    size="large",
    seq=128,
    batch=batch,
    dtype="float32",
    steps=2,
    warmup=1,
    variant=dict(LARGE_VARIANT),
    peak=False,
    memory_stats=True,
  )


def memory_record(compiled: Any, params: Any) -> dict[str, float]:
  """XLA's buffer accounting of a compiled train step, in GB and as a ratio to the 4 copies
  of `params` (weights, gradients, two Adam moments)."""
  param_b = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  rec = {"param_gb": param_b / 1e9, "params_grads_adam_gb": 4 * param_b / 1e9}
  m = compiled.memory_analysis()
  if m is not None:
    # Donated state aliases its outputs, so they are counted once.
    peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    peak += m.temp_size_in_bytes
    rec.update(
      xla_argument_gb=m.argument_size_in_bytes / 1e9,
      xla_temp_gb=m.temp_size_in_bytes / 1e9,
      xla_output_gb=m.output_size_in_bytes / 1e9,
      xla_alias_gb=m.alias_size_in_bytes / 1e9,
      xla_peak_gb=peak / 1e9,
      xla_peak_ratio=peak / (4 * param_b),
    )
  return rec


def step_gib(compiled: Any) -> float | None:
  """The device memory a compiled step needs by XLA's accounting (arguments + outputs, donated
  ones once, + temporaries), in GiB; None where the backend does not say."""
  m = compiled.memory_analysis()
  if m is None:
    return None
  peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  return (peak + m.temp_size_in_bytes) / 2**30
