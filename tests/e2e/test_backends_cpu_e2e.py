"""The end-to-end half of tests/unit/test_backends_cpu.py (real processes; slow): see its
docstring."""

import importlib.util

import jax
import numpy as np
import pytest
from unit.test_backends_cpu import CUSTOM_VJP, _micro_config, _train_batch, _train_params

from bert_jax import aot, backends, objectives, optim, train
from bert_jax import sharding as sh
from bert_jax.model import BertForPreTraining

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def _train_losses(
  kernels_mode: str, steps: int, dropout: float = 0.0, mesh_shape=(1, 1, 1), **model_fields
) -> tuple[list[float], str]:
  """Losses of `steps` steps of `train.jit_train_step` on a mesh (default one device), the
  model (`model_fields` set on _micro_config's) resolved as the trainer resolves it, and the
  step's jaxpr."""
  c = _micro_config(kernels_mode, dropout)
  c.model.update(model_fields)
  mesh = sh.make_mesh(mesh_shape, jax.devices()[: int(np.prod(mesh_shape))])
  cfg = backends.resolve_kernels(train.bert_config(c), mesh.devices.flat[0].platform)
  model = BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)
  obj = objectives.Objective.from_config(c)
  tables = aot._masking_tables(c)
  state, state_sh, _ = train.create_state(c, model, tx, mesh, sh.DEFAULT_RULES, jax.random.key(0))
  losses = []
  with sh.mesh_context(mesh, sh.DEFAULT_RULES):
    step_fn = train.jit_train_step(model, tx, obj, tables, 1, mesh, state_sh)
    text = str(jax.make_jaxpr(step_fn)(state, _train_batch(0), jax.random.key(1)))
    for i in range(steps):
      batch = jax.device_put(_train_batch(i % 2), sh.batch_sharding(mesh))
      state, metrics = step_fn(state, batch, jax.random.key(1))
      losses.append(float(metrics["loss"]))
  return losses, text


@pytest.mark.slow
def test_train_loop_losses_match_between_kernels():
  """15 optimizer steps of the real jitted train step (two batches in turn): the CPU kernels
  and the stock ops give the same loss curve (float32, dropout off) while it falls."""
  (cpu, cpu_jaxpr), (xla, xla_jaxpr) = _train_losses("cpu", 15), _train_losses("xla", 15)
  assert CUSTOM_VJP in cpu_jaxpr and CUSTOM_VJP not in xla_jaxpr
  np.testing.assert_allclose(cpu, xla, rtol=2e-5)
  assert cpu[-1] < cpu[0] - 0.1, cpu


@pytest.mark.parametrize("dropout_rng", ["threefry", "hash"])
@pytest.mark.slow
def test_train_step_is_deterministic_per_dropout_rng(dropout_rng):
  """Same command and seed, same bytes: two runs of the jitted train step (dropout 0.1, on a
  (2, 2, 2) mesh) with the same rng give bit-identical params; another step rng others."""
  c = _micro_config("auto", dropout=0.1)
  c.model.dropout_rng = dropout_rng
  a = _train_params(c, 1, mesh_shape=(2, 2, 2))
  b = _train_params(c, 1, mesh_shape=(2, 2, 2))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  other = _train_params(c, 2, mesh_shape=(2, 2, 2))
  word = lambda p: p["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert np.abs(word(a) - word(other)).max() > 0


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed")
@pytest.mark.slow
def test_tpu_compile_of_auto_is_the_stock_program(monkeypatch):
  """kernels='auto' compiled for a TPU (v4-8) is the stock program: the same lowered text as
  kernels='xla', hence the same per-device memory and FLOPs, and without the CPU kernels'
  constructs; kernels='cpu' forced onto the TPU lowers to another program."""
  lowered = {}
  real_jit_train_step = train.jit_train_step

  def capture(*args, **kwargs):
    jitted = real_jit_train_step(*args, **kwargs)

    class Capture:
      def lower(self, *a):
        lowered["last"] = jitted.lower(*a)
        return lowered["last"]

    return Capture()

  monkeypatch.setattr(train, "jit_train_step", capture)
  results, texts = {}, {}
  for mode in ("auto", "xla", "cpu"):
    c = _micro_config(mode, dropout=0.1)
    results[mode] = aot.compile_train_step(c, "v4-8", (1, -1, 1))
    texts[mode] = lowered.pop("last").as_text()
  assert results["auto"]["kernels"] == "xla" and results["cpu"]["kernels"] == "cpu"
  assert texts["auto"] == texts["xla"]
  assert texts["cpu"] != texts["xla"]
  for key in (
    "argument_bytes",
    "output_bytes",
    "temp_bytes",
    "total_bytes",
    "xla_flops_per_device",
  ):
    assert results["auto"][key] == results["xla"][key], key
