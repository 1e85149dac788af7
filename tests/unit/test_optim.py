"""bert_jax.optim: which parameters get weight decay (BERT's rule: not LayerNorm, not biases),
that the optimizer applies exactly that, the schedule's values (warmup, then linear decay), and
the update guard (a non-finite gradient or update leaves params and optimizer state as they
were)."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax import model as model_lib
from bert_jax import model_config, optim
from bert_jax.trees import flatten

TINY = model_config.config_for_size("tiny", vocab_size=64, max_position_embeddings=16)


def _opt(**kw):
  base = dict(
    name="adamw",
    lr=1e-4,
    b1=0.9,
    b2=0.999,
    eps=1e-6,
    weight_decay=0.01,
    warmup_steps=10,
    total_steps=100,
    clip_norm=1.0,
  )
  return ml_collections.ConfigDict({**base, **kw})


def _params(scan_layers: bool):
  cfg = dataclasses.replace(TINY, scan_layers=scan_layers)
  abstract = model_lib.abstract_params(cfg)
  return jax.tree.map(lambda a: jnp.ones(a.shape, a.dtype), abstract)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_decay_mask_is_kernels_and_embeddings_only(scan_layers):
  mask = flatten(optim.decay_mask(_params(scan_layers)))
  decayed = sorted(p for p, m in mask.items() if m)
  kept = sorted(p for p, m in mask.items() if not m)
  # Every weight matrix and embedding table decays; every LayerNorm parameter and bias does not.
  assert all(p.endswith(("/kernel", "/embedding")) for p in decayed), decayed
  assert all(p.endswith(("/bias", "/scale")) for p in kept), kept
  assert all("LayerNorm" in p for p in kept if p.endswith("/scale"))
  layer = "encoder/layers/layer" if scan_layers else "encoder/layer_0"
  assert {
    "bert/embeddings/word_embeddings/embedding",
    "bert/pooler/kernel",
    f"bert/{layer}/query/kernel",
    f"bert/{layer}/intermediate/kernel",
    "predictions/transform/kernel",
    "seq_relationship/kernel",
  } <= set(decayed)
  assert {
    "bert/embeddings/LayerNorm/scale",
    "bert/embeddings/LayerNorm/bias",
    f"bert/{layer}/attention_LayerNorm/scale",
    f"bert/{layer}/query/bias",
    "predictions/bias",  # the tied decoder's output bias
    "predictions/transform_LayerNorm/scale",
  } <= set(kept)
  # Counted: 3 embedding tables, the pooler, the MLM transform and NSP kernels, and per layer
  # (one stacked layer when scanned) query, key, value, attention_output, intermediate, output.
  layers = 1 if scan_layers else TINY.num_layers
  assert len(decayed) == 3 + 1 + 2 + 6 * layers


def test_adamw_decays_exactly_the_masked_leaves():
  """With a zero gradient, one AdamW step at learning rate lr only decays: w <- w - lr*wd*w on
  the masked leaves, nothing elsewhere."""
  params = _params(scan_layers=False)
  opt = _opt(warmup_steps=0, clip_norm=0.0, weight_decay=0.5)
  tx = optim.make_optimizer(opt)
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  mask = flatten(optim.decay_mask(params))
  for path, u in flatten(updates).items():
    want = -opt.lr * opt.weight_decay if mask[path] else 0.0
    np.testing.assert_allclose(np.asarray(u), want, rtol=1e-6, err_msg=path)


def test_schedule_warms_up_then_decays_linearly():
  lr = optim.learning_rate_schedule(_opt(lr=1e-4, warmup_steps=10, total_steps=110))
  steps = [0, 1, 5, 10, 35, 60, 109, 110]
  want = [0.0, 1e-5, 5e-5, 1e-4, 7.5e-5, 5e-5, 1e-6, 0.0]
  np.testing.assert_allclose([float(lr(s)) for s in steps], want, rtol=1e-5, atol=1e-12)
  no_warmup = optim.learning_rate_schedule(_opt(lr=2e-5, warmup_steps=0, total_steps=100))
  np.testing.assert_allclose([float(no_warmup(s)) for s in (0, 50, 100)], [2e-5, 1e-5, 0.0])


def test_schedule_errors():
  with pytest.raises(ValueError, match="opt.total_steps must be positive, got 0"):
    optim.learning_rate_schedule(_opt(total_steps=0, warmup_steps=0))
  with pytest.raises(ValueError, match=r"opt.warmup_steps \(100\) must be below"):
    optim.learning_rate_schedule(_opt(warmup_steps=100, total_steps=100))
  with pytest.raises(ValueError, match="config.opt.name must be 'adamw' or 'lamb', not 'sgd'"):
    optim.make_optimizer(_opt(name="sgd"))


@pytest.mark.parametrize(
  "tx, grads",
  [
    # Adam without eps: 0/0 where a gradient is exactly zero (a finite gradient).
    (optax.adam(1e-3, eps=0.0), [1.0, 0.0, 2.0]),
    # A learning rate that overflows float32: a finite gradient, an infinite update.
    (optax.sgd(3e38), [10.0, 1.0, 2.0]),
    # A non-finite gradient.
    (optax.adam(1e-3), [1.0, float("nan"), 2.0]),
  ],
  ids=["adam_eps0", "lr_overflow", "nan_gradient"],
)
def test_apply_update_skips_a_nonfinite_update(tx, grads):
  params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
  state = {"step": jnp.int32(0), "params": params, "opt_state": tx.init(params)}
  g = {"w": jnp.asarray(grads), "b": jnp.ones(2)}
  new, metrics = jax.jit(lambda s, g: optim.apply_update(s, g, tx))(state, g)
  assert float(metrics["nonfinite"]) == 1.0
  assert int(new["step"]) == 1
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state), strict=True):
    if a.ndim:  # params and optimizer state exactly as they were
      np.testing.assert_array_equal(a, b)


def test_apply_update_applies_a_finite_update():
  tx = optax.adam(1e-3)
  params = {"w": jnp.ones(3)}
  state = {"step": jnp.int32(0), "params": params, "opt_state": tx.init(params)}
  new, metrics = optim.apply_update(state, {"w": jnp.asarray([1.0, 0.0, -2.0])}, tx)
  assert float(metrics["nonfinite"]) == 0.0
  np.testing.assert_allclose(new["params"]["w"], [1 - 1e-3, 1.0, 1 + 1e-3], rtol=1e-6)
