"""Masked-LM input corruption on device (BERT's `create_masked_lm_predictions`, as pure JAX).

One code path serves on-the-fly masking in the jitted train step and `create_data
--write_masks`, so a static mask computed on the fly equals the written one bit for bit.

Randomness: `example_key` derives a per-example key, `fold_in(key(seed), example_id)` (static
masking: the same mask every epoch) or `fold_in(that, epoch)` (dynamic masking: a fresh mask
each epoch). An int seed becomes a new-style typed key with the threefry2x32 impl pinned, so
masks do not change when a run sets `jax_default_prng_impl` (e.g. to rbg for speed). The bits
also depend on `jax_threefry_partitionable` (default True); flipping it changes every mask, and
only with it on is a mask independent of how far its sequence is padded.

Deliberate differences from the original: the 10% random replacement is drawn from
non-special ids only (`MaskingTables.replace_ids`), and whole-word masking never joins a
"##" piece to a word across [CLS]/[SEP] (the original appends it to the previous word).

Shape key: B batch, L sequence length, P max predictions, V vocab, W words (<= L).
Cost per example: O(L log L) (one sort), plus an L-step `lax.scan` for whole-word masking
(the original's greedy "skip a word that would overshoot" rule is sequential).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Pinned so that static masks are reproducible whatever the process's default PRNG impl.
KEY_IMPL = "threefry2x32"


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """MLM masking settings (BERT defaults: 15% of tokens, then 80% [MASK], 10% random)."""

  max_predictions: int = 20
  masked_lm_prob: float = 0.15
  mask_frac: float = 0.8
  random_frac: float = 0.1
  whole_word: bool = False

  def __post_init__(self):
    if self.max_predictions < 1:
      raise ValueError(f"MaskingConfig.max_predictions must be >= 1, got {self.max_predictions}")
    if not 0.0 < self.masked_lm_prob <= 1.0:
      raise ValueError(f"MaskingConfig.masked_lm_prob must be in (0, 1], got {self.masked_lm_prob}")
    if self.mask_frac < 0 or self.random_frac < 0 or self.mask_frac + self.random_frac > 1.0:
      raise ValueError(
        "MaskingConfig.mask_frac and random_frac must be >= 0 with sum <= 1, got "
        f"{self.mask_frac} and {self.random_frac}"
      )


class MaskingTables(NamedTuple):
  """Vocabulary facts masking needs, built once per tokenizer (a pytree, so jit can take it).

  special: bool [V] control tokens; word_start: bool [V] token begins a word;
  replace_ids: int32 [R] the non-special ids random replacements are drawn from.
  """

  special: np.ndarray
  word_start: np.ndarray
  replace_ids: np.ndarray
  pad_id: int
  cls_id: int
  sep_id: int
  mask_id: int


def tables_from_tokenizer(tok: Any) -> MaskingTables:
  """Builds MaskingTables from a `bert_jax.tokenizers.tokenizer.Tokenizer`."""
  special = np.asarray(tok.special_mask(), dtype=bool)
  word_start = np.asarray(tok.word_start_mask(), dtype=bool)
  if special.ndim != 1 or special.shape != word_start.shape:
    raise ValueError(
      f"tokenizer special_mask {special.shape} and word_start_mask {word_start.shape} must be "
      "equal-length vectors"
    )
  replace_ids = np.flatnonzero(~special).astype(np.int32)
  if replace_ids.size == 0:
    raise ValueError("tokenizer has no non-special tokens to use as random replacements")
  return MaskingTables(
    special=special,
    word_start=word_start,
    replace_ids=replace_ids,
    pad_id=int(tok.pad_id),
    cls_id=int(tok.cls_id),
    sep_id=int(tok.sep_id),
    mask_id=int(tok.mask_id),
  )


def _base_key(seed: Any) -> Array:
  if isinstance(seed, jax.Array | np.ndarray) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return seed
  if isinstance(seed, int) or np.ndim(seed) == 0:
    return jax.random.key(seed, impl=KEY_IMPL)
  # A legacy uint32 PRNGKey: interpret it as threefry key data.
  return jax.random.wrap_key_data(jnp.asarray(seed, jnp.uint32), impl=KEY_IMPL)


def example_key(seed: Any, example_id: Any, epoch: Any = None) -> Array:
  """Per-example typed key: static `fold_in(key(seed), id)`, dynamic `fold_in(static, epoch)`.

  `seed` is an int (or 0-d int array), a typed key, or a legacy uint32 PRNGKey.
  """
  key = jax.random.fold_in(_base_key(seed), example_id)
  if epoch is not None:
    key = jax.random.fold_in(key, epoch)
  return key


def num_to_predict(lengths: Any, max_predictions: int, masked_lm_prob: float) -> np.ndarray:
  """How many positions a sequence of each length masks: the original's
  min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob)))). On the host in
  float64, rounded half to even as Python's round: a float32 product on device can land on the
  other side of a .5 boundary."""
  n = np.asarray(lengths, np.int64)
  return np.minimum(max_predictions, np.maximum(1, np.round(n * masked_lm_prob))).astype(np.int64)


def _num_to_predict_table(length: int, cfg: MaskingConfig) -> np.ndarray:
  lengths = np.arange(length + 1)
  return num_to_predict(lengths, cfg.max_predictions, cfg.masked_lm_prob).astype(np.int32)


def _select_tokens(bits_L: Array, cand_L: Array, n: Array, max_predictions: int) -> Array:
  """n uniformly random candidates without replacement (n <= #candidates)."""
  length = cand_L.shape[0]
  # 31 random bits as a score: ties (resolved by index) are ~L^2/2^32 rare.
  score_L = jnp.where(cand_L, (bits_L >> 1).astype(jnp.int32), -1)
  k = min(max_predictions, length)
  _, top_K = jax.lax.top_k(score_L, k)
  return jnp.zeros((length,), bool).at[top_K].set(jnp.arange(k) < n)


def _select_words(bits_L: Array, cand_L: Array, start_L: Array, n: Array) -> Array:
  """Whole words in random order, greedily: skip a word that would overshoot n, as BERT."""
  length = cand_L.shape[0]
  word_L = jnp.cumsum(start_L.astype(jnp.int32)) - 1
  # Non-candidates go to a dump bucket (index L) so they never count towards a word.
  word_L = jnp.where(cand_L, word_L, length)
  len_W = jnp.zeros((length + 1,), jnp.int32).at[word_L].add(1)[:length]
  # Word slots >= the number of words have length 0 and are never taken; they may sit
  # anywhere in the order without changing the relative order of real words.
  order_W = jnp.argsort(bits_L)

  def step(count, word_len):
    take = (word_len > 0) & (count + word_len <= n)
    return count + jnp.where(take, word_len, 0), take

  _, take_ordered_W = jax.lax.scan(step, jnp.zeros((), jnp.int32), len_W[order_W], unroll=8)
  taken_W = jnp.zeros((length + 1,), bool).at[order_W].set(take_ordered_W)
  return cand_L & taken_W[word_L]


def mask(
  key: Array, input_ids_L: Array, input_mask_L: Array, tables: MaskingTables, cfg: MaskingConfig
) -> dict[str, Array]:
  """Masks one sequence; returns masked input_ids [L] and P = cfg.max_predictions targets.

  Candidates are real tokens other than [PAD]/[CLS]/[SEP]/[MASK] ([UNK] may be chosen, as in
  BERT). masked_lm_positions are ascending; unused slots hold position 0, id 0, weight 0.0.
  """
  input_ids_L = jnp.asarray(input_ids_L, jnp.int32)
  real_L = jnp.asarray(input_mask_L) > 0
  length = input_ids_L.shape[0]
  num_preds = cfg.max_predictions
  # One draw serves all three decisions (threefry is the costly part to compile and run).
  # Shaped [L, 3] so position t always gets the same bits whatever L is: a sequence's mask
  # does not depend on how far it is padded (create_data may mask unpadded rows).
  select_L, action_L, replace_L = jax.random.bits(key, (length, 3), jnp.uint32).T

  cand_L = real_L
  for tid in (tables.pad_id, tables.cls_id, tables.sep_id, tables.mask_id):
    cand_L = cand_L & (input_ids_L != tid)
  n = jnp.asarray(_num_to_predict_table(length, cfg))[jnp.sum(real_L)]

  if cfg.whole_word:
    is_start_V = jnp.asarray(tables.word_start) | jnp.asarray(tables.special)
    word_start_L = is_start_V[input_ids_L]
    prev_cand_L = jnp.concatenate([jnp.zeros((1,), bool), cand_L[:-1]])
    # A piece with no candidate before it (right after [CLS]/[SEP]) starts its own word.
    start_L = cand_L & (word_start_L | ~prev_cand_L)
    selected_L = _select_words(select_L, cand_L, start_L, n)
  else:
    n = jnp.minimum(n, jnp.sum(cand_L))
    selected_L = _select_tokens(select_L, cand_L, n, num_preds)

  u_L = (action_L >> 8).astype(jnp.float32) * (1.0 / (1 << 24))  # exact uniform in [0, 1)
  replace_ids = jnp.asarray(tables.replace_ids, jnp.int32)
  # Modulo bias is < R / 2^32 (~1e-5 relative for BERT's vocab): negligible.
  random_L = replace_ids[(replace_L % replace_ids.shape[0]).astype(jnp.int32)]
  new_L = jnp.where(
    u_L < cfg.mask_frac,
    jnp.asarray(tables.mask_id, jnp.int32),
    jnp.where(u_L < cfg.mask_frac + cfg.random_frac, random_L, input_ids_L),
  )
  masked_ids_L = jnp.where(selected_L, new_L, input_ids_L)

  # Ascending positions, like the original's sorted masked_lms; count <= n <= P by construction.
  # (top_k of negated positions: cheaper to compile and run than a sized nonzero.)
  k = min(num_preds, length)
  neg_pos_K, _ = jax.lax.top_k(jnp.where(selected_L, -jnp.arange(length), -length), k)
  used_P = jnp.arange(num_preds) < jnp.sum(selected_L)
  positions_P = jnp.where(used_P, jnp.pad(-neg_pos_K, (0, num_preds - k)), 0)
  return dict(
    input_ids=masked_ids_L,
    masked_lm_positions=positions_P.astype(jnp.int32),
    masked_lm_ids=jnp.where(used_P, input_ids_L[positions_P], 0),
    masked_lm_weights=used_P.astype(jnp.float32),
  )


def mask_batch(
  seed: Any,
  example_id_B: Array,
  epoch_B: Array | None,
  input_ids_BL: Array,
  input_mask_BL: Array,
  tables: MaskingTables,
  cfg: MaskingConfig,
) -> dict[str, Array]:
  """vmap of `mask` over `example_key(seed, example_id, epoch)`; epoch_B=None is static masking.

  An example's mask depends only on (seed, example_id[, epoch]) and its tokens, never on the
  batch it sits in, jit, or the mesh.
  """
  if epoch_B is None:
    keys_B = jax.vmap(lambda i: example_key(seed, i))(example_id_B)
  else:
    keys_B = jax.vmap(lambda i, e: example_key(seed, i, e))(example_id_B, epoch_B)
  return jax.vmap(lambda k, ids, m: mask(k, ids, m, tables, cfg))(
    keys_B, input_ids_BL, input_mask_BL
  )


def ltr_targets(input_ids_BL: Array, input_mask_BL: Array) -> tuple[Array, Array]:
  """Next-token targets for the left-to-right objective: targets[t] = input_ids[t + 1].

  weights[t] = 1.0 where t + 1 is a real token, else 0.0 (the last position is always 0).
  """
  ids_BL = jnp.asarray(input_ids_BL, jnp.int32)
  next_real_BL = jnp.asarray(input_mask_BL)[:, 1:] > 0
  targets_BL = jnp.pad(ids_BL[:, 1:], ((0, 0), (0, 1)))
  weights_BL = jnp.pad(next_real_BL.astype(jnp.float32), ((0, 0), (0, 1)))
  return targets_BL, weights_BL
