"""The end-to-end half of tests/unit/test_aot.py (real processes; slow): see its
docstring."""

import os
import subprocess
import sys

import pytest
from unit.test_aot import HAS_LIBTPU, MICRO, _micro_config

from bert_jax import aot

needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed")


def _cli(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  cmd = [sys.executable, "-m", "bert_jax.aot", *args]
  return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _micro_flags(**extra):
  return [f"--config.{k}={v}" for k, v in {**MICRO, **extra}.items()]


@needs_libtpu
@pytest.mark.slow
def test_tpu_compile_cli():
  r = _cli("--config=configs/local.py", "--topology=v4-8", "--mesh=(1,-1,1)", *_micro_flags())
  assert r.returncode == 0, r.stderr[-2000:]
  out = r.stdout
  assert out.startswith("v4-8: 4 x TPU v4, mesh {'data': 1, 'fsdp': 4, 'tensor': 1}"), out
  assert "of 32 GiB HBM" in out


@needs_libtpu
@pytest.mark.slow
def test_tpu_does_not_fit():
  # Attention scores alone: 65536 x 2 heads x 512 x 512 fp32 = 128 GiB per v4 chip (of 32),
  # in the first layer (the last one runs only at the masked positions).
  c = _micro_config(
    **{"data.batch_size": 65536 * 4, "data.max_seq_length": 512, "model.num_layers": 2}
  )
  with pytest.raises(ValueError, match=r"^does not fit: v4-8 .*RESOURCE_EXHAUSTED"):
    aot.compile_train_step(c, "v4-8")
