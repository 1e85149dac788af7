"""Dropout: BertConfig.dropout_rng's keep-masks and the `Dropout` module every dropout of the
model is.

'threefry' is jax.random's default generator (flax's nn.Dropout, the same masks and values);
'hash' a counter hash of each element's flat index (murmur3's finaliser, as Philox in cuDNN's
dropout): a few integer ops per element that XLA fuses into their neighbours, and that the
flash kernels (backends/flash.py) compute for their own tiles, so they drop exactly what the
explicit attention drops with the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import backends
from bert_jax.model_config import BertConfig

Array = jax.Array


def _threshold(rate: float) -> Array:
  """uint32 bits at or above this are kept: probability 1 - rate, exact to 2**-32."""
  return jnp.uint32(min(round(rate * 2**32), 2**32 - 1))


def _fmix32(h: Array) -> Array:
  """murmur3's 32-bit finaliser: a bijective avalanche hash."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def hash_seed(key: Array) -> Array:
  """The two uint32 seed words `keep_mask` draws from its key."""
  return jax.random.bits(key, (2,), jnp.uint32)


def hash_keep(idx: Array, seed0: Array, seed1: Array, rate: float) -> Array:
  """`keep_mask`'s bits at the uint32 flat indices `idx` (also inside the Pallas kernels of
  backends/flash.py, which hash each tile's indices)."""
  return _fmix32(_fmix32(idx ^ seed0) + seed1) >= _threshold(rate)


def _seeded_mask(seed: Array, shape: tuple[int, ...], rate: float) -> Array:
  """`keep_mask` of `shape` from its seed words (`hash_seed`)."""
  idx = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  return hash_keep(idx, seed[0], seed[1], rate)


def keep_mask(key: Array, shape: tuple[int, ...], rate: float) -> Array:
  """Boolean dropout keep-mask, True with probability 1 - rate (exact to 2**-32).

  Two 32-bit words drawn from `key` seed a double murmur3 finaliser of each element's index
  (counter-based, as Philox in cuDNN's dropout): a few integer ops per element that XLA fuses,
  where threefry's rounds cost far more per element on a CPU. The index is an iota, which
  XLA's SPMD partitioner splits by shard, so each device hashes only its own elements."""
  return _seeded_mask(hash_seed(key), shape, rate)


def dropout(x: Array, keep: Array, rate: float) -> Array:
  """x with the elements where `keep` is False zeroed and the rest scaled by 1 / (1 - rate):
  flax's nn.Dropout given its mask."""
  return jax.lax.select(keep, x / (1.0 - rate), jnp.zeros_like(x))


# dropout_rng -> (key, shape, rate) -> boolean keep-mask, True with probability 1 - rate.
KEEP_MASKS: dict[str, Callable[[Array, tuple[int, ...], float], Array]] = {
  "threefry": lambda key, shape, rate: jax.random.bernoulli(key, 1.0 - rate, shape),
  "hash": keep_mask,
}


class Dropout(nn.Module):
  """Inverted dropout with the 'dropout' rng collection, as flax's nn.Dropout (with 'threefry'
  the same masks and values), keep-masks drawn by `KEEP_MASKS[rng_impl]`."""

  rate: float
  rng_impl: str = "threefry"  # a resolved BertConfig.dropout_rng

  def keep_mask(self, shape: tuple[int, ...]) -> Array:
    """The keep-mask for an input of `shape`."""
    return KEEP_MASKS[self.rng_impl](self.make_rng("dropout"), shape, self.rate)

  def hash_seed(self) -> Array:
    """The seed words of the 'hash' mask `keep_mask` would draw (whatever rng_impl): for
    kernels that hash their own tiles (attention_impl='flash')."""
    return hash_seed(self.make_rng("dropout"))

  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    return dropout(x, self.keep_mask(x.shape), self.rate)


def for_config(cfg: BertConfig, rate: float) -> Dropout:
  """A `Dropout` of `rate` drawing cfg's (resolved) dropout_rng masks."""
  return Dropout(rate, backends.resolved(cfg).dropout_rng)
