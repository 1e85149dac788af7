"""bert_jax.backends.cpu behind BertConfig.kernels: the CPU kernels give the stock XLA path's
outputs, losses and gradients; 'auto' takes the stock path on every backend but the CPU.

Each parity check also asserts that the two runs really used different ops (custom-VJP calls
in one jaxpr, none in the other), so it fails if the dispatch ignores the switch.
"""

import importlib.util

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import aot, backends, config_lib, objectives, optim, train
from bert_jax import sharding as sh
from bert_jax.model import BertForPreTraining

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None

# What only the CPU kernels put in a program: custom VJPs and the CPU/default weight-gradient
# switch (lax.platform_dependent). The hash dropout's murmur3 multiplier marks
# dropout_rng='hash', and the low-precision attention probabilities are a custom VJP of their
# own (attention_impl='explicit_lowp').
CUSTOM_VJP = "custom_vjp_call"


def _micro_config(kernels_mode: str, dropout: float = 0.0):
  c = config_lib.base_config("tiny")  # 2 layers, hidden 128
  c.update_from_flattened_dict(
    {
      "model.vocab_size": 256,
      "model.kernels": kernels_mode,
      "model.hidden_dropout_prob": dropout,
      "model.attention_dropout_prob": dropout,
      "data.max_seq_length": 32,
      "data.batch_size": 8,
      "masking.max_predictions": 5,
      "opt.lr": 3e-3,
      "opt.warmup_steps": 2,
    }
  )
  return c


def _train_batch(seed: int, b: int = 8, length: int = 32, vocab: int = 256):
  """Two segments; every second sequence padded after 24 tokens."""
  rng = np.random.default_rng(seed)
  mask = (np.arange(length) < np.array([length, 24] * (b // 2))[:, None]).astype(np.int32)
  ids = (rng.integers(5, vocab, (b, length)) * mask).astype(np.int32)
  ids[:, 0] = 1
  return dict(
    input_ids=ids,
    segment_ids=(np.arange(length) >= length // 2) * mask,
    input_mask=mask,
    next_sentence_label=rng.integers(0, 2, b).astype(np.int32),
    example_id=np.arange(b, dtype=np.int32) + seed * b,
    epoch=np.zeros(b, np.int32),
  )


def _train_losses(kernels_mode: str, steps: int) -> tuple[list[float], str]:
  """Losses of `steps` steps of `train.jit_train_step` on one device, the model resolved as
  the trainer resolves it, and the step's jaxpr."""
  c = _micro_config(kernels_mode)
  mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
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


def _train_params(c, step_rng: int, steps: int = 2, mesh_shape=(1, 1, 1)):
  """Params (as host arrays) after `steps` steps of the real jitted train step."""
  mesh = sh.make_mesh(mesh_shape, jax.devices()[: int(np.prod(mesh_shape))])
  cfg = backends.resolve_kernels(train.bert_config(c), mesh.devices.flat[0].platform)
  model = BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)
  obj = objectives.Objective.from_config(c)
  state, state_sh, _ = train.create_state(c, model, tx, mesh, sh.DEFAULT_RULES, jax.random.key(0))
  with sh.mesh_context(mesh, sh.DEFAULT_RULES):
    step_fn = train.jit_train_step(model, tx, obj, aot._masking_tables(c), 1, mesh, state_sh)
    for i in range(steps):
      batch = jax.device_put(_train_batch(i), sh.batch_sharding(mesh))
      state, _ = step_fn(state, batch, jax.random.key(step_rng))
  return jax.tree.map(np.asarray, nn.meta.unbox(state["params"]))


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
