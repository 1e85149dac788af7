"""bert_jax.backends.fused_norm in Pallas' interpreter: LayerNorm(x + dropout(h)) and its
gradients equal the unfused dropout (backends.dropout.Dropout with dropout_rng='hash', same
key) + add + XLA's LayerNorm, on one device and sharded; the kernels lower for CUDA through
Pallas' Triton backend; the model with kernels='fused' has the parameters, losses and
gradients of kernels='xla' with the hash dropout; config_schema takes the value."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from e2e.test_backends_cpu_e2e import _train_losses
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import (
  backends,
  config_lib,
  config_schema,
  model_config,
)
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax.backends import dropout as dropout_lib
from bert_jax.backends import fused_norm
from bert_jax.model import BertForPreTraining
from lab._cuda_program import lowered_for_cuda, pallas_calls, triton_calls

EPS = 1e-12
GRADS = ("dx", "dh", "dscale", "dbias")


def _inputs(shape, dtype=jnp.float32, seed=0):
  """x, h, scale, bias and an output cotangent; scale and bias away from 1 and 0 so that a
  wrong parameter gradient shows."""
  kx, kh, ks, kb, kg = jax.random.split(jax.random.key(seed), 5)
  d = shape[-1]
  x = jax.random.normal(kx, shape, jnp.float32).astype(dtype)
  h = (3.0 * jax.random.normal(kh, shape, jnp.float32)).astype(dtype)
  scale = 1.0 + 0.5 * jax.random.normal(ks, (d,), jnp.float32)
  bias = 0.5 * jax.random.normal(kb, (d,), jnp.float32)
  g = jax.random.normal(kg, shape, jnp.float32).astype(dtype)
  return x, h, scale, bias, g


def unfused(x, h, scale, bias, rate, key):
  """The model's path before kernels='fused': Dropout('hash') bound to `key`, the add, then
  XLA's LayerNorm (backends.XLA_OPS) with `scale` and `bias`, in x's dtype."""
  if rate > 0:
    h = dropout_lib.Dropout(rate, "hash").bind({}, rngs={"dropout": key})(h, deterministic=False)
  norm = backends.XLA_OPS.layer_norm(epsilon=EPS, dtype=x.dtype)
  return norm.apply({"params": {"scale": scale, "bias": bias}}, h + x)


def _mask_key(key):
  """The key Dropout('hash') bound to `key` draws its first mask from."""
  return dropout_lib.Dropout(0.1, "hash").bind({}, rngs={"dropout": key}).make_rng("dropout")


def fused(x, h, scale, bias, rate, key, **kw):
  seed = dropout_lib.hash_seed(_mask_key(key)) if rate > 0 else None
  return fused_norm.dropout_add_layer_norm(
    x, h, scale, bias, epsilon=EPS, dropout_rate=rate, dropout_seed=seed, interpret=True, **kw
  )


def _out_and_grads(fn, x, h, scale, bias, g, *args):
  @jax.jit
  def run(x, h, scale, bias, g):
    out, vjp = jax.vjp(lambda *a: fn(*a, *args), x, h, scale, bias)
    return out, vjp(g)

  return run(x, h, scale, bias, g)


def _assert_close(got, want, what, atol, rtol=0.0):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=what)


# (shape, dropout rate, backward steps > 1): D = 48 pads to 64 (masked columns), 21 and 45
# rows are not multiples of the blocks (masked rows); 'steps' makes the backward loop over
# several pieces in each of several programs (their partial sums added after).
CASES = {
  "nodrop": ((3, 7, 48), 0.0, False),
  "drop": ((3, 7, 48), 0.1, False),
  "drop_wide": ((2, 5, 128), 0.3, False),
  "steps": ((5, 9, 256), 0.1, True),
}


@pytest.mark.parametrize("case", CASES)
def test_equals_unfused_float32(case, monkeypatch):
  """Output, dx, dh and the scale and bias gradients equal the unfused path's with the same
  hash mask (float32: to rounding)."""
  shape, rate, steps = CASES[case]
  if steps:  # 45 rows of 16 a piece: 2 programs of 2 pieces
    monkeypatch.setattr(fused_norm, "BWD_MIN_PROGRAMS", 2)
    st = fused_norm._static(45, 256, rate=rate, epsilon=EPS, out_dtype=None, interpret=True)
    assert (st.block_rows, st.bwd_steps) == (16, 2)
  x, h, scale, bias, g = _inputs(shape)
  key = jax.random.key(4)
  want, want_grads = _out_and_grads(unfused, x, h, scale, bias, g, rate, key)
  got, got_grads = _out_and_grads(fused, x, h, scale, bias, g, rate, key)
  _assert_close(got, want, "output", atol=2e-6, rtol=1e-5)
  for name, a, b in zip(GRADS, got_grads, want_grads, strict=True):
    _assert_close(a, b, name, atol=1e-5, rtol=1e-5)
  if rate:  # the mask acted: some of dh is zero, as many as the rate says
    dropped = float(np.mean(np.asarray(got_grads[1]) == 0.0))
    assert abs(dropped - rate) < 0.08, dropped


def test_equals_unfused_bfloat16():
  """bfloat16 x and h (the model's compute dtype): the fused kernel keeps z = x + dropout(h)
  in float32 where the unfused path rounds it to bfloat16, so they agree to bfloat16's
  rounding; the mask is the same (dh is zero where keep_mask drops, and only there but for
  bfloat16's rounding to zero)."""
  x, h, scale, bias, g = _inputs((4, 16, 128), jnp.bfloat16)
  key = jax.random.key(5)
  want, want_grads = _out_and_grads(unfused, x, h, scale, bias, g, 0.1, key)
  got, got_grads = _out_and_grads(fused, x, h, scale, bias, g, 0.1, key)
  assert got.dtype == jnp.bfloat16 and got_grads[1].dtype == jnp.bfloat16
  _assert_close(got, want, "output", atol=0.06, rtol=0.02)
  keep = np.asarray(dropout_lib.keep_mask(_mask_key(key), h.shape, 0.1))
  dh = np.asarray(got_grads[1], np.float32)
  assert 0.05 < 1 - keep.mean() < 0.15 and not dh[~keep].any()
  assert np.mean(dh[keep] != 0) > 0.999
  for name, a, b in zip(GRADS, got_grads, want_grads, strict=True):
    scale_of = float(np.abs(np.asarray(b, np.float32)).max())
    _assert_close(a, b, name, atol=0.03 * scale_of, rtol=0.03)


def test_masks_follow_the_key_and_the_rate():
  """Another key drops other elements (and equals the unfused path with that key); rate 0 is
  LayerNorm(x + h) and rate 1 LayerNorm(x), as Dropout."""
  x, h, scale, bias, _ = _inputs((2, 8, 64))
  one = fused(x, h, scale, bias, 0.3, jax.random.key(1))
  two = fused(x, h, scale, bias, 0.3, jax.random.key(2))
  assert float(jnp.abs(one - two).max()) > 0.1
  _assert_close(one, unfused(x, h, scale, bias, 0.3, jax.random.key(1)), "key 1", atol=2e-6)
  plain = unfused(x, h, scale, bias, 0.0, None)
  _assert_close(fused(x, h, scale, bias, 0.0, None), plain, "rate 0", atol=2e-6)
  all_dropped = unfused(x, jnp.zeros_like(h), scale, bias, 0.0, None)
  _assert_close(fused(x, h, scale, bias, 1.0, jax.random.key(1)), all_dropped, "rate 1", atol=2e-6)
  with pytest.raises(ValueError, match="needs dropout_seed"):
    fused_norm.dropout_add_layer_norm(x, h, scale, bias, epsilon=EPS, dropout_rate=0.1)


def test_sharded_equals_unsharded_and_unfused():
  """On a (2, 2, 2) mesh with the batch over ('data', 'fsdp'): the kernels run per shard and
  each hashes its global row indices, so the masks, outputs and gradients are the global ones."""
  x, h, scale, bias, g = _inputs((4, 12, 48))
  args = (0.2, jax.random.key(3))
  want, want_grads = _out_and_grads(unfused, x, h, scale, bias, g, *args)
  single, single_grads = _out_and_grads(fused, x, h, scale, bias, g, *args)
  mesh = sh.make_mesh((2, 2, 2))
  rows = NamedSharding(mesh, PartitionSpec(sh.DATA_AXES, None, None))
  placed = [jax.device_put(a, rows) for a in (x, h)]
  rest = [jax.device_put(a, NamedSharding(mesh, PartitionSpec())) for a in (scale, bias)]
  g_placed = jax.device_put(g, rows)

  def sharded(x, h, scale, bias, *args):
    return fused(x, h, scale, bias, *args, batch_axes=sh.DATA_AXES)

  with jax.set_mesh(mesh):
    traced = jax.make_jaxpr(lambda *a: sharded(*a, *args))(*placed, *rest)
    got, got_grads = _out_and_grads(sharded, *placed, *rest, g_placed, *args)
  assert "shard_map" in str(traced)
  _assert_close(got, single, "sharded output", atol=1e-6)
  _assert_close(got, want, "output", atol=2e-6, rtol=1e-5)
  for name, a, b, c in zip(GRADS, got_grads, single_grads, want_grads, strict=True):
    _assert_close(a, b, name + " sharded", atol=1e-5, rtol=1e-5)
    _assert_close(a, c, name, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,hidden", [(jnp.bfloat16, 768), (jnp.float32, 1024)])
def test_lowers_for_cuda_with_triton(dtype, hidden):
  """The forward and backward kernels lower through Pallas' Triton backend for a CUDA device
  from this CPU host (BERT-Base's 768 padded to a 1024 tile, Large's 1024); Triton's compile
  to PTX happens only on a GPU."""
  x, h, scale, bias, g = _inputs((2, 64, hidden), dtype)
  seed = dropout_lib.hash_seed(jax.random.key(0))

  def step(x, h, scale, bias, g):
    fn = lambda *a: fused_norm.dropout_add_layer_norm(
      *a, epsilon=EPS, dropout_rate=0.1, dropout_seed=seed
    )
    out, vjp = jax.vjp(fn, x, h, scale, bias)
    return out, vjp(g)

  text = jax.jit(step).trace(x, h, scale, bias, g).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 2  # forward, backward
  assert "mosaic_gpu" not in text


# --- the model ---------------------------------------------------------------------------------

TINY = model_config.config_for_size(
  "tiny", vocab_size=64, max_position_embeddings=16, dropout_rng="hash"
)


@pytest.mark.parametrize("layers", ["unrolled", "scanned_remat"])
def test_model_fused_equals_xla_with_hash_dropout(layers):
  """BERT-tiny (float32, dropout 0.1): kernels='fused' has kernels='xla''s parameter tree
  (names, shapes), and its loss and every gradient with the same dropout rng; the program
  runs the fused kernels (two per sublayer, forward and backward under autodiff). Also with
  scanned layers (per-layer dropout rngs split by nn.scan) under full remat."""
  cfg = TINY
  if layers == "scanned_remat":
    cfg = dataclasses.replace(TINY, scan_layers=True, remat_policy="full")
  ids = jnp.arange(32).reshape(2, 16) % 64
  input_mask = jnp.ones((2, 16), jnp.int32).at[1, 10:].set(0)
  params = model_lib.init_params(BertForPreTraining(cfg), jax.random.key(0))
  results = {}
  for kernels in ("xla", "fused"):
    model = BertForPreTraining(dataclasses.replace(cfg, kernels=kernels))
    own = model_lib.init_params(model, jax.random.key(0))
    assert jax.tree.map(jnp.shape, own) == jax.tree.map(jnp.shape, params)

    def loss(p, model=model):
      out = model.apply(
        {"params": p}, ids, None, input_mask, deterministic=False,
        rngs={"dropout": jax.random.key(2)},
      )  # fmt: skip
      return jnp.sum(out["mlm_logits"] ** 2) * 1e-3

    step = jax.jit(jax.value_and_grad(loss))
    calls = pallas_calls(jax.make_jaxpr(step)(params))
    results[kernels] = (calls, *step(params))
  (calls_x, loss_x, grads_x), (calls_f, loss_f, grads_f) = results.values()
  # Per traced layer body (nn.scan traces one) 2 sublayers' forward and backward, and under
  # full remat the attention sublayer's forward again in the backward pass (the output
  # sublayer's output is the scan's carry, kept: its recomputation is dead code).
  layer_bodies = 1 if cfg.scan_layers else cfg.num_layers
  recomputed = 1 if cfg.remat_policy == "full" else 0
  assert (calls_x, calls_f) == (0, (2 * 2 + recomputed) * layer_bodies)
  assert float(loss_f) == pytest.approx(float(loss_x), rel=1e-6)
  flat_x = jax.tree_util.tree_leaves_with_path(grads_x)
  for (path, gx), gf in zip(flat_x, jax.tree.leaves(grads_f), strict=True):
    np.testing.assert_allclose(gf, gx, rtol=1e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_model_fused_trains_as_xla():
  """Four steps of the real train step (dropout 0.1, the hash masks, the pruned last layer)
  on a (2, 2, 2) mesh: kernels='fused' gives kernels='xla''s losses while the loss falls."""
  run = functools.partial(_train_losses, dropout=0.1, mesh_shape=(2, 2, 2), dropout_rng="hash")
  (xla, xla_jaxpr), (fused_losses, fused_jaxpr) = run("xla", 4), run("fused", 4)
  assert "pallas_call" in fused_jaxpr and "pallas_call" not in xla_jaxpr
  np.testing.assert_allclose(fused_losses, xla, rtol=1e-4)
  assert fused_losses[-1] < fused_losses[0], fused_losses


def test_train_step_lowers_for_cuda_with_the_fused_kernels():
  """BERT-tiny's train step with every backend field 'auto' (bf16, dropout 0.1), resolved for
  a GPU, lowers for CUDA with Triton kernels only: per layer flash attention's three and the
  fused residual LayerNorm's four (two sublayers, forward and backward), none interpreted."""
  cfg, text = lowered_for_cuda("auto")
  assert cfg.kernels == "fused"
  assert triton_calls(text) == (3 + 4) * cfg.num_layers


def test_fused_config_and_platforms():
  """'fused' is a kernels value config_schema takes (an unknown one is refused naming the
  values), 'auto' resolves to it on a CUDA GPU alone, and the model refuses it on a TPU in one
  line."""
  c = config_lib.base_config("tiny")
  c.model.kernels = "fused"
  config_schema.check_pretraining(c)
  c.model.kernels = "fusd"
  with pytest.raises(config_schema.ConfigError, match="must be one of auto, xla, cpu, fused"):
    config_schema.check_pretraining(c)
  for platform in ("cpu", "rocm", "tpu"):
    assert backends.resolve_kernels(TINY, platform).kernels != "fused"
  assert backends.resolve_kernels(TINY, "cuda").kernels == "fused"
  tpu = backends.resolve_kernels(dataclasses.replace(TINY, kernels="fused"), "tpu")
  with pytest.raises(ValueError, match="^kernels='fused' runs on GPUs .* not on tpu"):
    jax.eval_shape(lambda: model_lib.init_params(BertForPreTraining(tpu), jax.random.key(0)))
