"""bert_jax.backends.dropout: the dropout masks each `dropout_rng` draws (threefry is flax's
nn.Dropout; hash keeps the rate and scaling), and the model's dropout by rng implementation."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import backends
from bert_jax.backends import dropout as dropout_lib
from bert_jax.model import BertForPreTraining
from bert_jax.model_config import BertConfig
from unit._tiny_bert import TINY, _apply, _batch, _params


def test_threefry_dropout_is_flax_dropout():
  """dropout_rng='threefry' is nn.Dropout: the same masks and values from the same key."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 64)), jnp.bfloat16)
  for key in (jax.random.key(0), jax.random.key(7)):
    ours = dropout_lib.Dropout(0.3, "threefry").apply(
      {}, x, deterministic=False, rngs={"dropout": key}
    )
    theirs = nn.Dropout(0.3).apply({}, x, deterministic=False, rngs={"dropout": key})
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("rng_impl", ["threefry", "hash"])
def test_dropout_keep_rate_and_scaling(rng_impl):
  """Keep rate within binomial tolerance (5 sigma), kept values scaled by 1 / (1 - rate), the
  mask a function of the key alone, another key another mask."""
  rate, shape = 0.1, (256, 512)
  masks = dropout_lib.KEEP_MASKS[rng_impl]
  keep = np.asarray(jax.jit(masks, static_argnums=(1, 2))(jax.random.key(0), shape, rate))
  sigma = np.sqrt(rate * (1 - rate) / keep.size)
  assert abs(keep.mean() - (1 - rate)) < 5 * sigma, keep.mean()
  # No structure along either axis: every row and column keeps about 1 - rate.
  assert abs(keep.mean(0) - 0.9).max() < 6 * np.sqrt(rate * (1 - rate) / shape[0])
  assert abs(keep.mean(1) - 0.9).max() < 6 * np.sqrt(rate * (1 - rate) / shape[1])
  np.testing.assert_array_equal(keep, masks(jax.random.key(0), shape, rate))
  other = np.asarray(masks(jax.random.key(1), shape, rate))
  assert abs((keep != other).mean() - 2 * rate * (1 - rate)) < 5 * sigma
  x = jnp.ones((64, 64))
  drop = dropout_lib.Dropout(0.25, rng_impl)
  y = drop.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
  assert set(np.unique(np.asarray(y)).tolist()) == {0.0, float(np.float32(1.0 / 0.75))}
  assert drop.apply({}, x, deterministic=True) is x


def test_dropout_rng_config():
  for value in ("auto", "threefry", "hash"):
    assert BertConfig(dropout_rng=value).dropout_rng == value
  for retired in ("rbg", "hash_redraw"):  # values of earlier versions
    with pytest.raises(ValueError, match="^dropout_rng must be one of auto, threefry, hash, not"):
      BertConfig(dropout_rng=retired)
  for platform, family in (("cpu", "cpu"), ("tpu", "tpu"), ("gpu", "gpu"), ("cuda", "gpu")):
    got = backends.resolve_kernels(TINY, platform)
    assert got.dropout_rng == backends.DROPOUT_RNG_AUTO[family] and got.platform == family
    pinned = dataclasses.replace(TINY, dropout_rng="threefry")
    # The GPU's fused kernels draw the hash mask: threefry keeps XLA's ops there.
    kernels = "xla" if got.kernels == "fused" else got.kernels
    assert backends.resolve_kernels(pinned, platform) == (
      dataclasses.replace(got, dropout_rng="threefry", kernels=kernels)
    )
  # The model's dropout modules follow it (encoder, embeddings).
  for value in ("threefry", "hash"):
    cfg = backends.resolve_kernels(dataclasses.replace(TINY, dropout_rng=value), "cpu")
    assert dropout_lib.for_config(cfg, 0.1).rng_impl == value


def test_model_dropout_by_rng_impl():
  """The hash generator drops out reproducibly per key, differently per key, and not like
  threefry (so the switch took effect)."""
  rng_impl = "hash"
  params = _params(TINY)
  ids, seg, mask = _batch([8, 6], 8)

  def run(value, seed):
    model = BertForPreTraining(dataclasses.replace(TINY, dropout_rng=value))
    rngs = {"dropout": jax.random.key(seed)}
    f = lambda p: model.apply({"params": p}, ids, seg, mask, deterministic=False, rngs=rngs)
    return np.asarray(jax.jit(f)(params)["mlm_logits"])

  det = np.asarray(_apply(TINY)(params, ids, seg, mask)["mlm_logits"])
  a = run(rng_impl, 1)
  np.testing.assert_array_equal(a, run(rng_impl, 1))
  for other in (run(rng_impl, 2), run("threefry", 1), det):
    assert np.abs(a - other).max() > 1e-2
