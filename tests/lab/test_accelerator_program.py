"""The train step as an accelerator runs it: no embedding-table gradient is a low-precision
scatter-add (on GPUs its atomics serialise: 123 of BERT-Base's 187 ms step on an H200 were two
bf16 scatter-adds), in the traced program (kernels resolved for a GPU) and in the program
compiled for a TPU (libtpu's compile-only devices). Each check also finds the scatter-adds of
the lookups as they were before (nn.Embed casting its table first, the test_model reference),
so it can fail. Fine-tuning's model shares the encoder: the same checks and switches there.
"""

import dataclasses
import importlib.util
import json
import pathlib
import re

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest
from unit.test_model import NNEmbedEmbeddings

from bert_jax import aot, backends, config_lib, model_config, objectives, optim, train
from bert_jax import model as model_lib
from bert_jax.model import BertForPreTraining
from bert_jax.tasks import heads

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
REPO = str(pathlib.Path(__file__).resolve().parents[2])
LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def _micro_config(**model):
  """BERT-tiny in bf16 with small tables whose shapes no activation shares."""
  c = config_lib.base_config("tiny")  # 2 layers, hidden 128
  c.update_from_flattened_dict(
    {
      "model.vocab_size": 256,
      "model.max_position_embeddings": 64,
      "model.dtype": "bfloat16",
      "data.max_seq_length": 32,
      "data.batch_size": 8,
      "masking.max_predictions": 5,
      **{f"model.{k}": v for k, v in model.items()},
    }
  )
  return c


def _subjaxprs(value):
  if isinstance(value, jex.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, jex.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _subjaxprs(v)


def scatter_adds(jaxpr) -> list[tuple[tuple[int, ...], np.dtype]]:
  """(operand shape, dtype) of every scatter-add in `jaxpr` and all its sub-jaxprs (custom
  VJPs, scans, conds, pjit calls)."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive is jax.lax.scatter_add_p:
      aval = eqn.invars[0].aval
      found.append((tuple(aval.shape), np.dtype(aval.dtype)))
    for value in eqn.params.values():
      for sub in _subjaxprs(value):
        found += scatter_adds(sub)
  return found


def table_shapes(cfg: model_config.BertConfig) -> set[tuple[int, int]]:
  d = cfg.hidden_size
  return {(cfg.vocab_size, d), (cfg.max_position_embeddings, d), (cfg.type_vocab_size, d)}


def _train_step_scatters(c, platform: str) -> tuple[model_config.BertConfig, list]:
  """The scatter-adds of `train.make_train_step`'s jaxpr, the model resolved for `platform`."""
  cfg = backends.resolve_kernels(train.bert_config(c), platform)
  model = BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)
  step = train.make_train_step(
    model, tx, objectives.Objective.from_config(c), aot._masking_tables(c)
  )
  state = jax.eval_shape(train.state_init_fn(c, model, tx), jax.random.key(0))
  b, length = c.data.batch_size, c.data.max_seq_length
  batch = {k: jax.ShapeDtypeStruct((b, length), jnp.int32) for k in ("input_ids", "segment_ids")}
  batch["input_mask"] = jax.ShapeDtypeStruct((b, length), jnp.int32)
  for k in ("next_sentence_label", "example_id", "epoch"):
    batch[k] = jax.ShapeDtypeStruct((b,), jnp.int32)
  unboxed = jax.tree.map(lambda x: getattr(x, "value", x), state, is_leaf=_is_box)
  closed = jax.make_jaxpr(step)(unboxed, batch, jax.random.key(1))
  return cfg, scatter_adds(closed.jaxpr)


def _is_box(x):
  return hasattr(x, "unbox")


def _low_precision_table_scatters(cfg, found):
  return [(s, d) for s, d in found if d in LOW_PRECISION and s in table_shapes(cfg)]


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_train_step_for_accelerators_has_no_low_precision_table_scatter(platform, monkeypatch):
  """bf16 train step, kernels resolved for an accelerator: the word gradient is a float32
  scatter-add, positions and token types none at all; the nn.Embed lookups give three bf16
  scatter-adds into the tables."""
  cfg, found = _train_step_scatters(_micro_config(), platform)
  assert cfg.kernels == {"gpu": "fused", "tpu": "xla"}[platform] and cfg.dtype == "bfloat16"
  assert not _low_precision_table_scatters(cfg, found), found
  d = cfg.hidden_size
  assert ((cfg.vocab_size, d), np.dtype(jnp.float32)) in found
  assert not [s for s, _ in found if s in {(64, d), (2, d)}], found
  monkeypatch.setattr(model_lib, "Embeddings", NNEmbedEmbeddings)
  _, old = _train_step_scatters(_micro_config(), platform)
  assert sorted(_low_precision_table_scatters(cfg, old)) == sorted(
    (s, np.dtype(jnp.bfloat16)) for s in table_shapes(cfg)
  ), old


def test_finetuning_model_shares_lookups_dropout_and_attention(monkeypatch):
  """FinetuneModel builds on the same encoder: resolved for a GPU in bf16 its gradient has
  no low-precision table scatter, its dropouts (encoder and head) draw from dropout_rng's
  generator ('auto': the hash, attention dropout in the flash kernels), and its layers run
  attention_impl's implementation."""
  base = model_config.config_for_size(
    "tiny", vocab_size=256, max_position_embeddings=64, dtype="bfloat16"
  )
  ids = jnp.ones((4, 16), jnp.int32)

  def trace(cfg):
    model = heads.FinetuneModel(backends.resolve_kernels(cfg, "gpu"), "tagging", 3)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids)["params"])
    params = jax.tree.map(lambda x: getattr(x, "value", x), params, is_leaf=_is_box)

    def loss(p):
      rngs = {"dropout": jax.random.key(1)}
      return jnp.sum(model.apply({"params": p}, ids, deterministic=False, rngs=rngs))

    return jax.make_jaxpr(jax.grad(loss))(params)

  closed = trace(base)
  assert not _low_precision_table_scatters(base, scatter_adds(closed.jaxpr))
  hash_seeds = lambda jaxpr: str(jaxpr).count("random_bits[bit_width=32 shape=(2,)]")
  # Embeddings, 2 x (attention probabilities, attention output, FFN output), the head.
  assert hash_seeds(closed) == 8 and "pallas_call" in str(closed)
  threefry = trace(dataclasses.replace(base, dropout_rng="threefry"))
  assert hash_seeds(threefry) == 0 and "pallas_call" not in str(threefry)
  assert "random_bits[bit_width=32 shape=(4, 2, 16, 16)]" in str(threefry)  # attention probs
  # As in a process with a CUDA GPU (cuDNN's attention is traced only there).
  gpu = type("Gpu", (), {"device_kind": "NVIDIA H200", "compute_capability": "9.0"})
  monkeypatch.setattr(backends, "_local_gpu", gpu)
  calls = []
  real = jax.nn.dot_product_attention

  def record(q, k, v, *, mask, implementation):
    calls.append(implementation)
    return real(q, k, v, mask=mask, implementation="xla")

  monkeypatch.setattr(jax.nn, "dot_product_attention", record)
  trace(dataclasses.replace(base, attention_impl="cudnn", attention_dropout_prob=0.0))
  assert calls == ["cudnn"] * 4  # 2 layers, in the init and in the gradient


def test_finetuning_config_sets_dropout_rng_and_attention_on_a_checkpoint(tmp_path):
  """A fine-tuning config's dropout_rng and attention_impl apply on top of a checkpoint's
  architecture (as dtype and kernels do); a checkpoint of an earlier version storing values
  this version no longer has (attention_impl='fused', today's 'auto'; kernels='lowp', which
  computed 'xla''s values; dropout_rng='hash_redraw', the 'hash' masks) still reads."""
  from bert_jax.finetune import inputs as ft_inputs
  from bert_jax.interop import hf_io, loader

  spec = importlib.util.spec_from_file_location("finetune_config", f"{REPO}/configs/finetune.py")
  finetune_configs = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(finetune_configs)
  stored = dataclasses.asdict(model_config.config_for_size("tiny"))
  stored.update(attention_impl="fused", dropout_rng="hash_redraw", kernels="lowp")
  (tmp_path / hf_io.PARAMS_CONFIG).write_text(json.dumps(stored))
  (tmp_path / hf_io.PARAMS_FILE).write_bytes(b"")
  read = loader.read_config(tmp_path)[1]
  assert (read.attention_impl, read.dropout_rng, read.kernels) == ("auto", "hash", "xla")
  c = finetune_configs.get_config("custom,seeds=1,size=tiny")
  c.init = str(tmp_path)
  c.model.dropout_rng, c.model.attention_impl = "threefry", "explicit_lowp"
  cfg, _ = ft_inputs.model_config(c)
  assert (cfg.dropout_rng, cfg.attention_impl) == ("threefry", "explicit_lowp")
  assert cfg.hidden_size == 128 and cfg.num_layers == 2


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed")
@pytest.mark.slow
def test_tpu_compiled_train_step_has_no_low_precision_table_scatter(monkeypatch):
  """The bf16 train step compiled for a TPU (v4-8, compile-only) has no bf16 scatter into a
  (sharded) embedding table, and a float32 one for the word gradient; with the nn.Embed
  lookups it has three."""
  compiled = {}
  real_jit_train_step = train.jit_train_step

  def capture(*args, **kwargs):
    jitted = real_jit_train_step(*args, **kwargs)

    class Lowered:
      def __init__(self, lowered):
        self.lowered = lowered

      def compile(self):
        out = self.lowered.compile()
        compiled["text"] = out.as_text()
        return out

    class Jitted:
      def lower(self, *a):
        return Lowered(jitted.lower(*a))

    return Jitted()

  monkeypatch.setattr(train, "jit_train_step", capture)
  # Rank-2 scatters: the tables (an activation's gradient is rank 3, the masking's is bool).
  rank2 = re.compile(r"= (bf16|f16|f32)\[\d+,\d+\]\S* scatter\(")

  def table_scatters():
    aot.compile_train_step(_micro_config(), "v4-8", (1, -1, 1))
    return sorted(m.group(1) for m in rank2.finditer(compiled.pop("text")))

  assert table_scatters() == ["f32"]
  monkeypatch.setattr(model_lib, "Embeddings", NNEmbedEmbeddings)
  assert table_scatters() == ["bf16", "bf16", "bf16"]
