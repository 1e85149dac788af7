"""bert_jax.benchmark.finetune_step: the fine-tuning engine's config, and the vmapped-seeds probe
built on it."""

import importlib.util
import pathlib

import jax
import numpy as np
import pytest

from bert_jax import sharding as sh
from bert_jax.benchmark import finetune_step


@pytest.mark.slow
def test_vmap_seeds_probe_steps_each_seed_as_its_own_step():
  """tools/probes/vmap_seeds_probe.py: seed k of the vmapped step gets seed k's single step."""
  spec = importlib.util.spec_from_file_location(
    "vmap_seeds_probe",
    pathlib.Path(__file__).resolve().parents[2] / "tools" / "probes" / "vmap_seeds_probe.py",
  )
  probe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(probe)
  config = finetune_step.bench_config("tiny", 16, 2, "float32", {})
  mesh = sh.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  with sh.mesh_context(mesh, sh.rules_from_config(config.mesh.rules)):
    single, multi, states, state_s, batch, batch_s, rngs = probe.build(config, 2)
    first = jax.tree.map(lambda x: np.asarray(x[0]), state_s)
    np.testing.assert_array_equal(
      first["params"]["head"]["classifier"]["kernel"],
      states[0]["params"]["head"]["classifier"]["kernel"],
    )
    assert not np.array_equal(
      first["params"]["head"]["classifier"]["kernel"],
      np.asarray(state_s["params"]["head"]["classifier"]["kernel"][1]),
    )
    state_s, m_s = multi(state_s, batch_s, rngs)
    for k in range(2):
      st, m = single(states[k], batch, rngs[k])
      np.testing.assert_allclose(m_s["loss"][k], m["loss"], rtol=1e-5)
      jax.tree.map(
        lambda a, b, k=k: np.testing.assert_allclose(a[k], b, rtol=1e-4, atol=1e-6),
        state_s["params"],
        st["params"],
      )


def test_bench_config_is_the_recipe_at_the_benchmark_size_and_its_batch_all_real():
  config = finetune_step.bench_config("tiny", 32, 4, "bfloat16", {"hidden_dropout_prob": 0.0})
  recipe = finetune_step.recipe_module().get_config("rotten_tomatoes")
  assert config.opt.lr == recipe.opt.lr and config.opt.epochs == recipe.opt.epochs
  assert (config.model.num_layers, config.model.hidden_size) == (2, 128)  # tiny
  assert config.model.dtype == "bfloat16" and config.model.hidden_dropout_prob == 0.0
  assert (config.data.batch_size, config.data.max_seq_length) == (4, 32)
  assert tuple(config.mesh.shape) == (1, 1, 1)
  batch = finetune_step.host_batch(config, 30522)
  assert batch["input_ids"].shape == (4, 32) and batch["label"].shape == (4,)
  assert batch["weight"].dtype == np.float32 and (batch["weight"] == 1).all()
  eng = finetune_step.engine(config)
  assert eng.cfg.num_layers == 2 and eng.cfg.kernels == "cpu"  # resolved for this backend
  with pytest.raises(ValueError, match="'nope' is not a BertConfig field"):
    finetune_step.bench_config("tiny", 32, 4, "float32", {"nope": 1})
