"""bert_jax.optim: which parameters get weight decay (BERT's rule: not LayerNorm, not biases),
that the optimizer applies exactly that, and the schedule's values (warmup, then linear decay)."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax.trees import flatten

TINY = model_lib.config_for_size("tiny", vocab_size=64, max_position_embeddings=16)


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
