"""bert_jax.aot: compile the real train step without running it.

The CPU test always runs (8 fake devices, a (2,2,2) mesh); the TPU tests need libtpu's
compile-only devices (`pip install 'bert_jax[tpu]'`) and are skipped without it.
"""

import importlib.util

import jax
import numpy as np
import pytest

from bert_jax import aot, config_lib, train
from bert_jax import model as model_lib

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
MICRO = {
  "model.vocab_size": 512,
  "model.num_layers": 1,
  "model.hidden_size": 32,
  "model.num_heads": 2,
  "model.intermediate_size": 64,
  "data.batch_size": 8,
  "data.max_seq_length": 32,
  "masking.max_predictions": 5,
  "opt.total_steps": 10,
  "opt.warmup_steps": 1,
}


def _micro_config(**extra):
  c = config_lib.base_config("tiny")
  for k, v in {**MICRO, **extra}.items():
    section, key = k.split(".")
    c[section][key] = v
  return c


def _shard_bytes(abstract_tree, shardings):
  """Bytes one device holds of a tree, from the shardings alone."""
  total = 0
  for x, s in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings), strict=True):
    total += int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
  return total


def test_parse_topology_and_mesh():
  assert aot.parse_topology("v5e-16") == ("v5e-16", 1)
  assert aot.parse_topology("2xv5e-16") == ("v5e-16", 2)
  assert aot.parse_topology("cpu") == ("cpu", 1)
  with pytest.raises(ValueError, match="--topology=v9-8: unknown"):
    aot.parse_topology("v9-8")
  assert aot.parse_mesh("(1,-1,1)") == (1, -1, 1)
  assert aot.parse_mesh("2, 2, 2") == (2, 2, 2)
  with pytest.raises(ValueError, match="--mesh=a,b: expected three integers"):
    aot.parse_mesh("a,b")
  # HBM per chip as documented by Cloud TPU.
  assert aot.TOPOLOGIES["v5e-16"].hbm_bytes == 16 * aot.GiB
  assert aot.TOPOLOGIES["v4-8"].hbm_bytes == 32 * aot.GiB
  assert aot.TOPOLOGIES["v5p-8"].hbm_bytes == 95 * aot.GiB
  assert aot.TOPOLOGIES["v6e-8"].hbm_bytes == 32 * aot.GiB


def test_cpu_compile_of_the_real_train_step():
  c = _micro_config()
  r = aot.compile_train_step(c, "cpu", (2, 2, 2))
  assert r["num_devices"] == 8 and r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
  cfg = train.bert_config(c)
  assert r["params"] == model_lib.count_params(model_lib.abstract_params(cfg))
  expected_flops = model_lib.train_flops_per_token(cfg, 32, 5) * 8 * 32 / 8
  assert r["model_flops_per_device"] == pytest.approx(expected_flops)
  assert r["xla_flops_per_device"] > 0.5 * expected_flops  # XLA sees at least the matmuls
  # The donated state is aliased by the new state: outputs hold it once, not twice.
  assert r["alias_bytes"] > 0 and r["output_bytes"] >= r["alias_bytes"]
  assert r["total_bytes"] == (
    r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
  )
  # The arguments are this device's shards of the state plus its slice of the batch.
  import flax.linen as nn
  import jax.numpy as jnp

  from bert_jax import optim
  from bert_jax import sharding as sh

  mesh = sh.make_mesh((2, 2, 2))
  model = model_lib.BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)

  def init(rng):
    params = model_lib.init_params(model, rng, 8)
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

  boxed = jax.eval_shape(init, jax.random.key(0))
  state_bytes = _shard_bytes(
    nn.meta.unbox(boxed), sh.logical_shardings(boxed, mesh, sh.DEFAULT_RULES)
  )
  batch_bytes = (3 * 32 + 3) * (8 // 4) * 4  # 3 [B,L] + 3 [B] int32, B split 4 ways
  assert state_bytes + batch_bytes <= r["argument_bytes"] <= 1.05 * (state_bytes + batch_bytes)
  assert r["hbm_bytes"] is None
  text = aot.format_report(r)
  assert text.startswith("cpu: 8 x cpu, mesh {'data': 2, 'fsdp': 2, 'tensor': 2}")
  assert "compile" in text and "total" in text


def test_config_errors_are_one_line():
  with pytest.raises(ValueError, match="not divisible by the data-parallel size"):
    aot.compile_train_step(_micro_config(**{"data.batch_size": 6}), "cpu", (1, -1, 1))
  if not HAS_LIBTPU:
    with pytest.raises(ImportError, match=r"needs libtpu: pip install 'bert_jax\[tpu\]'"):
      aot.compile_train_step(_micro_config(), "v4-8")
