"""bert_jax.sharding on 8 fake CPU devices: sharded == one device, params placed by the rules."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import model as model_lib
from bert_jax import sharding
from bert_jax.model import BertForPreTraining
from bert_jax.model_config import BertConfig

# Every sharded dim divides its mesh axes: vocab/heads/mlp over tensor<=4, hidden over fsdp<=2,
# batch over data*fsdp<=8.
CFG = BertConfig(
  vocab_size=128,
  hidden_size=32,
  num_layers=2,
  num_heads=4,
  intermediate_size=64,
  max_position_embeddings=16,
  scan_layers=True,
)
RULES = sharding.DEFAULT_RULES
MESHES = [(2, 2, 2), (8, 1, 1), (1, 2, 4)]


def _batch():
  rng = np.random.default_rng(0)
  lengths = np.array([8, 7, 6, 5, 8, 3, 8, 4])
  ids = rng.integers(1, CFG.vocab_size, (8, 8)).astype(np.int32)
  mask = (np.arange(8)[None] < lengths[:, None]).astype(np.int32)
  return {
    "input_ids": ids * mask,
    "segment_ids": ((np.arange(8)[None] >= lengths[:, None] // 2) * mask).astype(np.int32),
    "input_mask": mask,
    "positions": rng.integers(0, 3, (8, 3)).astype(np.int32),
    "targets": rng.integers(1, CFG.vocab_size, (8, 3)).astype(np.int32),
    "nsp_label": (np.arange(8) % 2).astype(np.int32),
  }


def _forward_and_grad(params, batch):
  """Outputs and gradients of an MLM + NSP loss: one compiled function per mesh."""
  model = BertForPreTraining(CFG)

  def loss_fn(p):
    out = model.apply(
      {"params": p},
      batch["input_ids"],
      batch["segment_ids"],
      batch["input_mask"],
      batch["positions"],
    )
    logp = jax.nn.log_softmax(out["mlm_logits"])
    mlm = -jnp.take_along_axis(logp, batch["targets"][..., None], -1).mean()
    nsp_logp = jax.nn.log_softmax(out["nsp_logits"])
    nsp = -jnp.take_along_axis(nsp_logp, batch["nsp_label"][:, None], -1).mean()
    return mlm + nsp, out

  (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  keep = ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits")
  return {"loss": loss, **{k: out[k] for k in keep}}, grads


def _init_fn(rng):
  return model_lib.init_params(BertForPreTraining(CFG), rng)


@functools.cache
def _reference():
  """Params made by init_sharded on the (2,2,2) mesh, and one-device outputs/grads for them."""
  mesh = sharding.make_mesh((2, 2, 2))
  params, shardings, _ = sharding.init_sharded(_init_fn, mesh, RULES, jax.random.key(0))
  host = jax.device_get(params)
  device = jax.devices()[0]
  out, grads = jax.jit(_forward_and_grad)(
    jax.device_put(host, device), jax.device_put(_batch(), device)
  )
  return params, shardings, host, jax.device_get(out), jax.device_get(grads)


def _expected_spec(names):
  rules = dict(RULES)
  return P(*(rules.get(n) if n is not None else None for n in names))


def _strip(spec):
  """P('a', None) and P('a') are the same placement."""
  parts = list(spec)
  while parts and parts[-1] is None:
    parts.pop()
  return tuple(parts)


def test_param_shardings_follow_the_rules():
  params, shardings, _, _, _ = _reference()
  leaf = lambda tree, path: functools.reduce(lambda t, k: t[k], path.split("/"), tree)
  expected = {
    "bert/embeddings/word_embeddings/embedding": P("tensor", "fsdp"),
    "bert/embeddings/LayerNorm/scale": P("fsdp"),
    "bert/encoder/layers/layer/query/kernel": P(None, "fsdp", "tensor", None),
    "bert/encoder/layers/layer/query/bias": P(None, "tensor", None),
    "bert/encoder/layers/layer/attention_output/kernel": P(None, "tensor", None, "fsdp"),
    "bert/encoder/layers/layer/intermediate/kernel": P(None, "fsdp", "tensor"),
    "bert/encoder/layers/layer/output/kernel": P(None, "tensor", "fsdp"),
    "bert/pooler/kernel": P("fsdp", "tensor"),
    "predictions/bias": P("tensor"),
    "seq_relationship/kernel": P("fsdp", None),
  }
  for path, spec in expected.items():
    x = leaf(params, path)
    assert isinstance(x.sharding, NamedSharding), path
    assert _strip(x.sharding.spec) == _strip(spec), (path, x.sharding.spec)
    assert _strip(leaf(shardings, path).spec) == _strip(spec), path
  # The scanned query kernel (layers, D, H, K) = (2, 32, 4, 8) really is split 2 x 2 ways.
  q = leaf(params, "bert/encoder/layers/layer/query/kernel")
  assert {s.data.shape for s in q.addressable_shards} == {(2, 16, 2, 8)}
  # Every parameter: its spec is exactly its logical names mapped through the rules.
  boxed = jax.eval_shape(_init_fn, jax.random.key(0))
  names = jax.tree.leaves(nn.get_partition_spec(boxed), is_leaf=lambda x: isinstance(x, P))
  actual = jax.tree.leaves(params)
  assert len(names) == len(actual) == 30
  for logical, x in zip(names, actual, strict=True):
    assert _strip(x.sharding.spec) == _strip(_expected_spec(logical)), (logical, x.sharding)


def test_unrolled_layout_shardings():
  cfg = dataclasses.replace(CFG, scan_layers=False)
  mesh = sharding.make_mesh((1, 2, 4))
  boxed = jax.eval_shape(
    lambda r: model_lib.init_params(BertForPreTraining(cfg), r), jax.random.key(0)
  )
  sh = sharding.logical_shardings(boxed, mesh, RULES)
  layer = sh["bert"]["encoder"]["layer_1"]
  assert _strip(layer["key"]["kernel"].spec) == ("fsdp", "tensor")
  assert _strip(layer["intermediate"]["kernel"].spec) == ("fsdp", "tensor")
  assert _strip(layer["output_LayerNorm"]["scale"].spec) == ("fsdp",)


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_matches_one_device(shape):
  _, _, host, ref_out, ref_grads = _reference()
  mesh = sharding.make_mesh(shape)
  assert dict(mesh.shape) == dict(zip(sharding.MESH_AXES, shape, strict=True))
  assert all(t == AxisType.Auto for t in mesh.axis_types)
  boxed = jax.eval_shape(_init_fn, jax.random.key(0))
  param_sh = sharding.logical_shardings(boxed, mesh, RULES)
  batch_sh = sharding.batch_sharding(mesh)
  params = jax.device_put(host, param_sh)
  batch = jax.device_put(_batch(), batch_sh)  # committed inputs must match in_shardings
  with sharding.mesh_context(mesh, RULES):
    step = jax.jit(
      _forward_and_grad,
      in_shardings=(param_sh, batch_sh),
      out_shardings=(sharding.replicated(mesh), param_sh),
    )
    out, grads = step(params, batch)
  # Gradients come back sharded exactly like the params.
  q = grads["bert"]["encoder"]["layers"]["layer"]["query"]["kernel"]
  assert q.sharding == param_sh["bert"]["encoder"]["layers"]["layer"]["query"]["kernel"]
  for key, want in ref_out.items():
    np.testing.assert_allclose(np.asarray(out[key]), want, atol=1e-5, rtol=0, err_msg=key)
  flat_ref = jax.tree_util.tree_leaves_with_path(ref_grads)
  flat = jax.tree.leaves(jax.device_get(grads))
  for (path, want), got in zip(flat_ref, flat, strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=jax.tree_util.keystr(path))
  assert np.abs(flat[0]).max() > 0


def test_compile_ahead_leaves_the_first_call_nothing_to_compile(backend_compiles):
  mesh = sharding.make_mesh((2, 2, 2), jax.devices())
  rows = NamedSharding(mesh, P(sharding.DATA_AXES))

  def scaled_sum(x, w):
    return jnp.tanh(x @ w).sum(axis=1) * 3.0

  f = jax.jit(scaled_sum, in_shardings=(rows, None), out_shardings=rows)
  spec = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=rows)
  # Placed as `to_global` places a batch (committed to its sharding, as the spec says).
  x, w = jax.device_put(jnp.ones((16, 8)), rows), jnp.full((8, 4), 0.5)
  future = sharding.compile_ahead(f, spec, w)
  assert future.result() is not None  # compiled in its thread
  backend_compiles.clear()
  jax.block_until_ready(f(x, w))
  assert backend_compiles == []
  np.testing.assert_allclose(f(x, w), np.tanh(np.ones((16, 8)) @ np.full((8, 4), 0.5)).sum(1) * 3)
  # Another shape is another program: that one compiles at its first call (the listener hears).
  x8 = jax.device_put(jnp.ones((8, 8)), rows)
  jax.block_until_ready(f(x8, w))
  assert backend_compiles.count("jit(scaled_sum)") == 1


def test_under_mesh_traces_the_logical_constraints_into_the_call(backend_compiles):
  """A step built under mesh_context but called outside it traces without its activations'
  constraints (the trainer and fine-tuning did so until 2026-11-28); under_mesh calls it inside:
  the program that runs is the one lowered under the mesh."""
  mesh = sharding.make_mesh((2, 2, 2), jax.devices())

  def step(x):
    return nn.with_logical_constraint(x * 2.0, (sharding.ACT_BATCH, sharding.ACT_EMBED))

  f = jax.jit(step)
  x = jnp.ones((8, 4))
  with sharding.mesh_context(mesh, RULES):
    inside = f.lower(x).as_text()
  assert "sharding_constraint" not in f.lower(x).as_text() and "sharding_constraint" in inside
  np.testing.assert_array_equal(sharding.under_mesh(f, mesh, RULES)(x), x * 2.0)
  assert backend_compiles.count("jit(step)") == 1
  with sharding.mesh_context(mesh, RULES):
    f(x)  # the same program: nothing compiles
  assert backend_compiles.count("jit(step)") == 1
  f(x)  # outside the mesh: the program without the constraint
  assert backend_compiles.count("jit(step)") == 2
