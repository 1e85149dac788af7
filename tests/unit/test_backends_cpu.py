"""bert_jax.backends.cpu behind BertConfig.kernels: the CPU kernels give the stock XLA path's
outputs, losses and gradients; 'auto' takes the stock path on every backend but the CPU.

Each parity check also asserts that the two runs really used different ops (custom-VJP calls
in one jaxpr, none in the other), so it fails if the dispatch ignores the switch.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import aot, backends, config_lib, model_config, objectives, optim, train
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax.backends import cpu as cpu_kernels
from bert_jax.model import BertForPreTraining
from bert_jax.model_config import BertConfig

TINY = model_config.config_for_size("tiny", vocab_size=128, max_position_embeddings=16)
# What only the CPU kernels put in a program: custom VJPs and the CPU/default weight-gradient
# switch (lax.platform_dependent). The hash dropout's murmur3 multiplier marks
# dropout_rng='hash', and the low-precision attention probabilities are a custom VJP of their
# own (attention_impl='explicit_lowp').
CUSTOM_VJP = "custom_vjp_call"
CPU_KERNELS = ("name=_matmul", "name=add_bias", "platform_index")
HASH = str(0x85EBCA6B)


# --- resolve_kernels --------------------------------------------------------------------------


def test_resolve_kernels():
  for platform in ("tpu", "rocm"):
    assert backends.resolve_kernels(TINY, platform).kernels == "xla"
  for platform in ("gpu", "cuda"):  # no GPU in this process: lowering for one
    assert backends.resolve_kernels(TINY, platform).kernels == "fused"
  assert backends.resolve_kernels(TINY, "cpu").kernels == "cpu"
  for explicit in ("xla", "cpu", "fused"):
    cfg = dataclasses.replace(TINY, kernels=explicit)
    for platform in ("cpu", "tpu", "gpu"):
      assert backends.resolve_kernels(cfg, platform).kernels == explicit
  # Only the 'auto' fields and the platform change, and the parameters are the same in every
  # mode.
  resolved = backends.resolve_kernels(TINY, "cuda")
  assert resolved.platform == "gpu"
  assert dataclasses.replace(resolved, kernels="auto", dropout_rng="auto", platform="") == TINY
  assert backends.resolve_kernels(resolved, "cuda") == resolved
  shapes = lambda cfg: jax.tree.map(lambda x: (x.shape, x.dtype), model_lib.abstract_params(cfg))
  assert shapes(resolved) == shapes(dataclasses.replace(TINY, kernels="cpu"))
  assert shapes(resolved) == shapes(dataclasses.replace(TINY, kernels="fused"))
  refused = "^kernels must be one of auto, xla, cpu, fused, not 'lowp'$"
  with pytest.raises(ValueError, match=refused):
    BertConfig(kernels="lowp")  # a value of earlier versions


def test_unresolved_auto_follows_the_default_backend():
  assert jax.default_backend() == "cpu"  # conftest
  assert backends.ops_for(TINY) is backends.CPU_OPS
  assert backends.ops_for(dataclasses.replace(TINY, kernels="xla")) is backends.XLA_OPS
  assert backends.ops_for(backends.resolve_kernels(TINY, "tpu")) is backends.XLA_OPS


# --- model parity: CPU kernels vs stock XLA ops ------------------------------------------------


def _random_params(cfg: BertConfig, seed: int = 0):
  rng = np.random.default_rng(seed)

  def draw(path, x):
    scale = "scale" in jax.tree_util.keystr(path)
    return jnp.asarray(float(scale) + 0.1 * rng.standard_normal(x.shape), x.dtype)

  return jax.tree_util.tree_map_with_path(draw, model_lib.abstract_params(cfg))


def _batch(seed: int = 0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, 128, (2, 8)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 5:], ids[1, 5:] = 0, 0
  seg = np.zeros_like(ids)
  seg[:, 4:] = 1
  return ids, seg * mask, mask


def _loss_outputs_grads(cfg: BertConfig, params, masked: bool, attentions: bool):
  """(loss, outputs, grads, jaxpr text) of an MLM + NSP loss through BertForPreTraining."""
  model = BertForPreTraining(cfg)
  ids, seg, mask = _batch()
  positions = np.array([[1, 3, 6], [2, 4, 0]], np.int32) if masked else None
  n = 3 if masked else 8
  targets = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, n))

  def loss(p):
    out = model.apply({"params": p}, ids, seg, mask, positions, output_attentions=attentions)
    logp = jax.nn.log_softmax(out["mlm_logits"])
    mlm = -jnp.take_along_axis(logp, targets[..., None], -1).mean()
    nsp = -jax.nn.log_softmax(out["nsp_logits"])[:, 1].mean()
    return mlm + nsp, out

  fn = jax.value_and_grad(loss, has_aux=True)
  text = str(jax.make_jaxpr(fn)(params))
  (value, out), grads = jax.jit(fn)(params)
  return value, out, grads, text


def _assert_close(a, b, rtol, what, scale=0.0):
  """Equal to `rtol` relative to the larger of b's largest value and `scale`."""
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  atol = rtol * max(np.abs(b).max(), scale, 1e-6)
  np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


PARITY = {
  # name: (config overrides, masked positions, output_attentions, rtol)
  "pruned_last_layer": (dict(), True, False, 1e-5),
  "scanned": (dict(scan_layers=True), True, False, 1e-5),
  "causal_all_positions": (dict(causal=True), False, False, 1e-5),
  "causal_pruned": (dict(causal=True), True, False, 1e-5),
  "explicit_softmax": (dict(), True, True, 1e-5),
  "bf16": (dict(dtype="bfloat16"), True, False, 2e-2),
  "bf16_explicit_softmax": (dict(dtype="bfloat16"), True, True, 2e-2),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_cpu_kernels_match_stock_ops(case):
  over, masked, attentions, rtol = PARITY[case]
  # One attention form on both sides (on CPU 'auto' takes the custom-VJP explicit_lowp in
  # bf16 whichever `kernels`): this compares the kernels switch alone.
  cpu = dataclasses.replace(TINY, kernels="cpu", attention_impl="explicit", **over)
  xla = dataclasses.replace(cpu, kernels="xla")
  params = _random_params(cpu)
  loss_c, out_c, g_c, text_c = _loss_outputs_grads(cpu, params, masked, attentions)
  loss_x, out_x, g_x, text_x = _loss_outputs_grads(xla, params, masked, attentions)
  assert CUSTOM_VJP in text_c and CUSTOM_VJP not in text_x  # the switch took effect
  assert out_c.keys() == out_x.keys()
  for key in ("mlm_logits", "nsp_logits", "pooled_output"):
    assert out_c[key].dtype == out_x[key].dtype
    _assert_close(out_c[key], out_x[key], rtol, key)
  for i, (pc, px) in enumerate(
    zip(out_c.get("attentions", ()), out_x.get("attentions", ()), strict=True)
  ):
    _assert_close(pc, px, rtol, f"attentions[{i}]")
  _assert_close(loss_c, loss_x, rtol, "loss")
  assert jax.tree.structure(g_c) == jax.tree.structure(g_x)
  flat_c = jax.tree_util.tree_leaves_with_path(g_c)
  scale = 0.01 * max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_x))
  for (path, gc), gx in zip(flat_c, jax.tree.leaves(g_x), strict=True):
    name = jax.tree_util.keystr(path)
    assert gc.dtype == gx.dtype == jnp.float32
    if name.endswith("['key']['bias']"):  # softmax ignores it: rounding noise in both modes
      assert max(float(jnp.abs(gc).max()), float(jnp.abs(gx).max())) < scale, name
    else:
      _assert_close(gc, gx, rtol, name, scale)
  # Every other parameter is trained (no tensor silently ignored by one of the paths).
  zero = [
    jax.tree_util.keystr(p) for p, g in jax.tree_util.tree_leaves_with_path(g_x) if not g.any()
  ]
  assert not zero, zero


def test_cpu_kernels_reach_every_dense_layer():
  """kernels='cpu': every Dense matmul and bias add runs through the kernels' VJPs (one per
  kernel), every LayerNorm through cpu_kernels.LayerNorm; kernels='xla': none of them."""

  def counts(mode):
    cfg = dataclasses.replace(TINY, kernels=mode)
    params = _random_params(cfg)
    ids, seg, mask = _batch()
    model = BertForPreTraining(cfg)
    positions = np.array([[1, 2], [3, 4]], np.int32)
    f = lambda p: jnp.sum(model.apply({"params": p}, ids, seg, mask, positions)["mlm_logits"])
    text = str(jax.make_jaxpr(jax.grad(f))(params))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    n_kernels = sum(p.endswith("['kernel']") for p in paths)
    return text.count("_matmul_bwd"), text.count("_add_bias_bwd"), n_kernels

  matmuls, biases, n_kernels = counts("cpu")
  assert matmuls == n_kernels and biases == n_kernels + 1  # + the MLM output bias
  assert counts("xla")[:2] == (0, 0)
  layer_norms = lambda mode: sum(
    isinstance(m, cpu_kernels.LayerNorm)
    for m in _modules(BertForPreTraining(dataclasses.replace(TINY, kernels=mode)))
  )
  assert layer_norms("cpu") == 2 * TINY.num_layers + 2 and layer_norms("xla") == 0


def _modules(model: nn.Module) -> list[nn.Module]:
  """Every submodule `model` creates in a forward pass."""
  found = []

  def record(next_fun, args, kwargs, context):
    found.append(context.module)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    jax.eval_shape(lambda r: model.init(r, *model_lib.dummy_inputs(1, 8)), jax.random.key(0))
  return list({id(m): m for m in found}.values())


def test_dropout_masks_follow_dropout_rng_not_kernels():
  """The CPU kernels and the stock ops draw the same dropout masks for one dropout_rng (the
  outputs agree to float32 rounding), and each generator its own masks."""
  ids, seg, mask = _batch()
  params = _random_params(TINY)

  def run(kernels_mode, dropout_rng, seed=1):
    cfg = dataclasses.replace(TINY, kernels=kernels_mode, dropout_rng=dropout_rng)
    rngs = {"dropout": jax.random.key(seed)}
    return jax.jit(
      lambda p: BertForPreTraining(cfg).apply(
        {"params": p}, ids, seg, mask, deterministic=False, rngs=rngs
      )
    )(params)["nsp_logits"]

  det = BertForPreTraining(TINY).apply({"params": params}, ids, seg, mask)["nsp_logits"]
  outs = {}
  for rng_impl in ("threefry", "hash"):
    outs[rng_impl] = run("cpu", rng_impl)
    np.testing.assert_allclose(outs[rng_impl], run("xla", rng_impl), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outs[rng_impl], run("cpu", rng_impl))
    assert np.abs(np.asarray(outs[rng_impl] - det)).max() > 1e-3
    assert np.abs(np.asarray(outs[rng_impl] - run("cpu", rng_impl, seed=2))).max() > 1e-3
  assert np.abs(np.asarray(outs["hash"] - outs["threefry"])).max() > 1e-3


# --- the real train step ----------------------------------------------------------------------


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


def _train_step_jaxpr(c, platform: str) -> str:
  cfg = backends.resolve_kernels(train.bert_config(c), platform)
  model = BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)
  obj = objectives.Objective.from_config(c)
  step = train.make_train_step(model, tx, obj, aot._masking_tables(c))
  state = jax.eval_shape(train.state_init_fn(c, model, tx), jax.random.key(0))
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _train_batch(0))
  return str(jax.make_jaxpr(step)(nn.meta.unbox(state), batch, jax.random.key(1)))


def test_default_train_step_for_accelerators_has_no_cpu_kernels():
  """The default config (kernels, dropout_rng and attention_impl 'auto', dropout on) resolved
  for a TPU or GPU traces to a train step without the CPU kernels, its dropout masks drawn by
  that platform's DROPOUT_RNG_AUTO; resolved for the CPU it has them."""
  c = _micro_config("auto", dropout=0.1)
  assert c.model.kernels == BertConfig.kernels == "auto"
  assert c.model.dropout_rng == c.model.attention_impl == "auto"
  for platform in ("tpu", "gpu"):
    text = _train_step_jaxpr(c, platform)
    assert not [op for op in CPU_KERNELS if op in text], platform
    assert (HASH in text) == (backends.DROPOUT_RNG_AUTO[platform] == "hash"), platform
  text = _train_step_jaxpr(c, "cpu")
  assert all(op in text for op in CPU_KERNELS)
  assert (HASH in text) == (backends.DROPOUT_RNG_AUTO["cpu"] == "hash")


# --- the kernels themselves -------------------------------------------------------------------


def _bf16_round(x):
  return jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)


@pytest.mark.parametrize("in_shape,out", [((4, 6), 7), ((4, 6), 30)], ids=["x_narrow", "x_wide"])
def test_cpu_weight_gradient_layout_matches_plain_dot(in_shape, out):
  """_dw_cpu (a transposed copy of the narrower operand, then a dot) is the same contraction
  as _dw, whichever operand it transposes."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, *in_shape)), jnp.bfloat16)
  g = jnp.asarray(rng.normal(size=(3, 5, out)), jnp.bfloat16)
  a = jax.jit(functools.partial(cpu_kernels._dw_cpu, 2))(x, g)
  b = jax.jit(functools.partial(cpu_kernels._dw, 2))(x, g)
  ref = np.einsum("abij,abk->ijk", np.asarray(x, np.float32), np.asarray(g, np.float32))
  assert a.shape == (*in_shape, out) and a.dtype == jnp.float32
  np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "x_shape,w_shape,contract",
  [((2, 8, 6), (6, 20), 1), ((2, 8, 20), (20, 6), 1), ((2, 8, 3, 4), (3, 4, 5), 2)],
  ids=["x_narrow", "x_wide", "two_axis"],
)
def test_float32_matmul_vjp_matches_autodiff(x_shape, w_shape, contract):
  """float32 matmul's custom VJP (for its dW layout on CPU) gives autodiff's gradients,
  whichever operand `_dw_cpu` transposes."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
  w = jnp.asarray(rng.normal(size=w_shape), jnp.float32)
  gy = jnp.asarray(rng.normal(size=x_shape[: len(x_shape) - contract] + w_shape[contract:]))

  def fast(x, w):
    return jnp.sum(cpu_kernels.matmul(x, w, contract, "float32") * gy)

  def ref(x, w):
    return jnp.sum(jnp.tensordot(x, w, contract) * gy)

  got = jax.jit(jax.grad(fast, argnums=(0, 1)))(x, w)
  want = jax.grad(ref, argnums=(0, 1))(x, w)
  for a, e in zip(got, want, strict=True):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


def test_low_precision_custom_vjps_match_float32_autodiff():
  """bf16 matmul, tied decoder and bias add: gradients equal float32 autodiff on the same
  (bf16-rounded) operands and cotangents, up to float32 summation order; the bias gradient
  is a float32 sum (autodiff would accumulate it in bf16)."""
  rng = np.random.default_rng(1)
  x = _bf16_round(rng.normal(size=(2, 64, 16)))
  w = _bf16_round(rng.normal(size=(16, 4, 8)))
  b = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)
  table = _bf16_round(rng.normal(size=(50, 16)))
  gy = _bf16_round(rng.normal(size=(2, 64, 4, 8)))
  gl = _bf16_round(rng.normal(size=(2, 64, 50)))

  def fast(x, w, b, table):
    y = cpu_kernels.add_bias(cpu_kernels.matmul(x, w, 1, "bfloat16"), b)
    logits = cpu_kernels.tied_logits(x, table, "bfloat16")
    return jnp.sum(y.astype(jnp.float32) * gy) + jnp.sum(logits * gl)

  def ref(x, w, b, table):
    y = jnp.einsum("bld,dhk->blhk", x, w) + b
    logits = jnp.einsum("bld,vd->blv", x, table)
    return jnp.sum(y * gy) + jnp.sum(logits * gl)

  got = jax.jit(jax.grad(fast, argnums=(0, 1, 2, 3)))(x, w, b, table)
  want = jax.grad(ref, argnums=(0, 1, 2, 3))(x, w, b, table)
  for name, a, e in zip(("x", "w", "b", "table"), got, want, strict=True):
    assert a.dtype == jnp.float32, name
    np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4 * float(jnp.abs(e).max()), err_msg=name)


def test_attention_custom_vjps_match_float32_autodiff():
  rng = np.random.default_rng(2)
  q, k, v = (_bf16_round(rng.normal(size=(2, 6, 3, 4))) for _ in range(3))
  p = _bf16_round(rng.random(size=(2, 3, 6, 6)))
  gs, gc = _bf16_round(rng.normal(size=(2, 3, 6, 6))), _bf16_round(rng.normal(size=(2, 6, 3, 4)))
  bf = lambda *xs: [x.astype(jnp.bfloat16) for x in xs]

  def fast(q, k, p, v):
    q, k, p, v = bf(q, k, p, v)
    s = cpu_kernels.attention_scores(q, k)
    c = cpu_kernels.attention_context(p, v)
    return jnp.sum(s * gs) + jnp.sum(c * gc)

  def ref(q, k, p, v):
    s = jnp.einsum("bqhk,bshk->bhqs", q, k)
    c = jnp.einsum("bhqs,bshk->bqhk", p, v)
    return jnp.sum(s * gs) + jnp.sum(c * gc)

  got = jax.jit(jax.grad(fast, argnums=(0, 1, 2, 3)))(q, k, p, v)
  want = jax.grad(ref, argnums=(0, 1, 2, 3))(q, k, p, v)
  for name, a, e in zip("qkpv", got, want, strict=True):
    # The gradients come back in the operands' dtype (bf16): equal up to its rounding.
    np.testing.assert_allclose(a, e, rtol=2**-7, atol=2**-7 * float(jnp.abs(e).max()), err_msg=name)


def test_layer_norm_kernel_matches_flax():
  """cpu_kernels.LayerNorm: nn.LayerNorm's parameters and values, float32 inside for bf16 input."""
  rng = np.random.default_rng(4)
  x = jnp.asarray(3.0 + rng.normal(size=(2, 5, 16)), jnp.float32)
  init = dict(epsilon=1e-12, param_dtype=jnp.float32)
  ours, flax_ln = cpu_kernels.LayerNorm(**init), nn.LayerNorm(**init, use_fast_variance=False)
  params = jax.tree.map(
    lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype),
    flax_ln.init(jax.random.key(0), x),
  )
  assert jax.tree.structure(ours.init(jax.random.key(0), x)) == jax.tree.structure(params)
  np.testing.assert_allclose(ours.apply(params, x), flax_ln.apply(params, x), rtol=1e-5, atol=1e-5)
  y16 = cpu_kernels.LayerNorm(**init, dtype=jnp.bfloat16).apply(params, x.astype(jnp.bfloat16))
  assert y16.dtype == jnp.bfloat16
  np.testing.assert_allclose(y16.astype(jnp.float32), ours.apply(params, x), atol=0.05)


# --- ahead-of-time compile for a TPU (libtpu compile-only) -----------------------------------
