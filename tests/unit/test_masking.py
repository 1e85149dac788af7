"""Tests for bert_jax.masking: statistics on real token ids, whole words, keys, padding."""

import functools
import pathlib
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import masking

DATA = pathlib.Path(__file__).resolve().parents[2] / "bert_jax" / "data"
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
NOT_CANDIDATE = np.array([PAD, CLS, SEP, MASK])


@functools.cache
def vocab() -> list[str]:
  return (DATA / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8").splitlines()


@functools.cache
def tables() -> masking.MaskingTables:
  # Built from the vocab file directly so these tests do not depend on
  # bert_jax.tokenizers.tokenizer.
  toks = vocab()
  special = np.array(
    [
      t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") or bool(re.fullmatch(r"\[unused\d+\]", t))
      for t in toks
    ]
  )
  word_start = np.array([not t.startswith("##") for t in toks])
  return masking.MaskingTables(
    special=special,
    word_start=word_start,
    replace_ids=np.flatnonzero(~special).astype(np.int32),
    pad_id=PAD,
    cls_id=CLS,
    sep_id=SEP,
    mask_id=MASK,
  )


@functools.cache
def corpus_ids() -> np.ndarray:
  """The bundled corpus as WordPiece ids (crude: lowercase, split punctuation, greedy pieces)."""
  index = {t: i for i, t in enumerate(vocab())}
  text = (DATA / "sample_public_domain.txt").read_text(encoding="utf-8").lower()
  ids = []
  for word in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text):
    pieces, start = [], 0
    while start < len(word):
      end = len(word)
      while (
        end > start and (word[start:end] if start == 0 else "##" + word[start:end]) not in index
      ):
        end -= 1
      if end == start:
        pieces = [UNK]
        break
      pieces.append(index[word[start:end] if start == 0 else "##" + word[start:end]])
      start = end
    ids.extend(pieces)
  return np.array(ids, np.int32)


def make_batch(batch: int, length: int, seed: int = 0, short_frac: float = 0.1):
  """[CLS] A [SEP] B [SEP] rows of real ids; short_frac of rows shorter than `length`."""
  rng = np.random.default_rng(seed)
  stream = corpus_ids()
  n_real_B = np.where(
    rng.random(batch) < short_frac, rng.integers(5, length + 1, batch), length
  ).astype(np.int32)
  offset_B = rng.integers(0, len(stream) - length, batch)
  ids_BL = stream[offset_B[:, None] + np.arange(length)].copy()
  rows = np.arange(batch)
  ids_BL[:, 0] = CLS
  ids_BL[rows, rng.integers(2, n_real_B - 1)] = SEP  # end of segment A
  ids_BL[rows, n_real_B - 1] = SEP
  mask_BL = (np.arange(length) < n_real_B[:, None]).astype(np.int32)
  ids_BL = ids_BL * mask_BL
  return ids_BL, mask_BL


def expected_count(ids_BL, mask_BL, cfg):
  """The original's rule: min(P, max(1, round(n * p))) (Python round), capped by candidates."""
  n_real = mask_BL.sum(1)
  n_cand = ((mask_BL > 0) & ~np.isin(ids_BL, NOT_CANDIDATE)).sum(1)
  rule = [min(cfg.max_predictions, max(1, round(int(n) * cfg.masked_lm_prob))) for n in n_real]
  return np.minimum(rule, n_cand)


@functools.cache
def jit_mask_batch(cfg):
  # Cached per config so tests share compilations; the seed is traced like the train step's.
  f = jax.jit(functools.partial(masking.mask_batch, tables=tables(), cfg=cfg))
  return lambda seed, *args: f(jnp.int32(seed), *args)


def check_outputs(ids_BL, mask_BL, out):
  """Invariants every output must satisfy; returns (selected bool [B,L], masked ids [B,L])."""
  pos_BP = np.asarray(out["masked_lm_positions"])
  lab_BP = np.asarray(out["masked_lm_ids"])
  w_BP = np.asarray(out["masked_lm_weights"])
  new_BL = np.asarray(out["input_ids"])
  assert pos_BP.dtype == np.int32 and lab_BP.dtype == np.int32 and w_BP.dtype == np.float32
  used_BP = w_BP > 0
  count_B = used_BP.sum(1)
  # Used slots come first, positions strictly ascending; unused slots are 0 / 0 / 0.0.
  assert np.array_equal(used_BP, np.arange(w_BP.shape[1]) < count_B[:, None])
  assert np.all(np.isin(w_BP, [0.0, 1.0]))
  assert np.all(np.where(used_BP[:, 1:], np.diff(pos_BP, axis=1) > 0, True))
  assert np.all(pos_BP[~used_BP] == 0) and np.all(lab_BP[~used_BP] == 0)
  rows_BP = np.broadcast_to(np.arange(len(pos_BP))[:, None], pos_BP.shape)
  selected_BL = np.zeros(ids_BL.shape, bool)
  selected_BL[rows_BP[used_BP], pos_BP[used_BP]] = True
  # Labels are the original ids; positions are real non-special tokens ([UNK] allowed).
  assert np.array_equal(lab_BP[used_BP], ids_BL[rows_BP[used_BP], pos_BP[used_BP]])
  assert np.all(mask_BL[selected_BL] == 1)
  assert not np.any(np.isin(ids_BL[selected_BL], NOT_CANDIDATE))
  # Nothing else changes.
  assert np.array_equal(new_BL[~selected_BL], ids_BL[~selected_BL])
  return selected_BL, new_BL


def test_statistics_on_a_million_real_tokens():
  cfg = masking.MaskingConfig(max_predictions=20)
  ids_BL, mask_BL = make_batch(8704, 128)
  n_real = int(mask_BL.sum())
  assert n_real >= 1_000_000
  out = jit_mask_batch(cfg)(7, jnp.arange(len(ids_BL)), None, ids_BL, mask_BL)
  selected_BL, new_BL = check_outputs(ids_BL, mask_BL, out)

  # Exactly the original's count in every row, and ~15% overall.
  count_B = selected_BL.sum(1)
  assert np.array_equal(count_B, expected_count(ids_BL, mask_BL, cfg))
  assert abs(count_B.sum() / n_real - 0.15) < 0.002, count_B.sum() / n_real

  # Uniform over candidates: every position of a full row is about equally likely.
  full_BL = mask_BL.all(1)[:, None] & (ids_BL != SEP) & (np.arange(128) > 0)
  per_pos = (selected_BL & full_BL).sum(0)[1:127] / full_BL.sum(0)[1:127]
  assert abs(per_pos.mean() - 19 / 126) < 0.005 and per_pos.std() < 0.015

  # 80 / 10 / 10 per position.
  orig, new = ids_BL[selected_BL], new_BL[selected_BL]
  is_mask, kept = new == MASK, new == orig
  randomised = ~is_mask & ~kept
  n_sel = len(orig)
  for frac, want in ((is_mask.mean(), 0.8), (kept.mean(), 0.1), (randomised.mean(), 0.1)):
    assert abs(frac - want) < 0.01, (frac, want, n_sel)
  # Random replacements: never special, and spread over the whole non-special vocabulary.
  t = tables()
  assert not t.special[new[randomised]].any()
  rep = new[randomised]
  sem = t.replace_ids.std() / np.sqrt(len(rep))
  assert abs(rep.mean() - t.replace_ids.mean()) < 5 * sem
  assert rep.min() < 2000 and rep.max() > 29000


def word_ids(ids_BL, mask_BL, t):
  """Independent numpy word segmentation: word index per candidate token, -1 elsewhere."""
  cand_BL = (mask_BL > 0) & ~np.isin(ids_BL, NOT_CANDIDATE)
  prev_BL = np.pad(cand_BL[:, :-1], ((0, 0), (1, 0)))
  start_BL = cand_BL & (t.word_start[ids_BL] | t.special[ids_BL] | ~prev_BL)
  return np.where(cand_BL, np.cumsum(start_BL, axis=1) - 1, -1)


def test_whole_word_masking_never_splits_a_word_and_follows_greedy_rule():
  cfg = masking.MaskingConfig(max_predictions=20, whole_word=True)
  ids_BL, mask_BL = make_batch(2048, 128, seed=1)
  out = jit_mask_batch(cfg)(3, jnp.arange(len(ids_BL)), None, ids_BL, mask_BL)
  selected_BL, _ = check_outputs(ids_BL, mask_BL, out)

  word_BL = word_ids(ids_BL, mask_BL, tables())
  batch, length = ids_BL.shape
  flat = (np.arange(batch)[:, None] * length + word_BL)[word_BL >= 0]
  word_len = np.bincount(flat, minlength=batch * length).reshape(batch, length)
  word_sel = np.bincount(flat, selected_BL[word_BL >= 0], batch * length).reshape(batch, length)
  # Every word is either fully selected or not at all.
  assert np.all((word_sel == 0) | (word_sel == word_len))
  multi = (word_len > 1) & (word_sel == word_len)
  assert multi.sum() > 500  # the corpus really has multi-piece words, and they get masked

  # Greedy: never more than the budget, and every skipped word would have overshot it.
  budget_B = expected_count(ids_BL, mask_BL, cfg)
  count_B = selected_BL.sum(1)
  assert np.all(count_B <= budget_B)
  left_B = budget_B - count_B
  skipped = (word_len > 0) & (word_sel == 0)
  assert np.all(~skipped | (word_len > left_B[:, None]))
  assert count_B.sum() / budget_B.sum() > 0.99
  assert abs(count_B.sum() / mask_BL.sum() - 0.15) < 0.003

  # Multi-piece words are chosen as often (per word) as single-piece ones, as in a shuffle.
  single_rate = ((word_len == 1) & (word_sel > 0)).sum() / (word_len == 1).sum()
  multi_rate = multi.sum() / (word_len > 1).sum()
  assert abs(multi_rate - single_rate) < 0.03, (multi_rate, single_rate)


def test_count_and_positions_for_every_length():
  cfg = masking.MaskingConfig(max_predictions=6)
  length = 48
  ids_BL, _ = make_batch(length + 1, length, seed=2, short_frac=0.0)
  # Row r has r real tokens: [CLS] ... [SEP]; rows 0 and 1 have no candidates at all.
  n_real_B = np.arange(length + 1)
  mask_BL = (np.arange(length) < n_real_B[:, None]).astype(np.int32)
  ids_BL = ids_BL.copy()
  ids_BL[:, 0] = CLS
  ids_BL[np.arange(2, length + 1), n_real_B[2:] - 1] = SEP
  ids_BL = ids_BL * mask_BL
  for whole_word in (False, True):
    cfg = masking.MaskingConfig(max_predictions=6, whole_word=whole_word)
    out = jit_mask_batch(cfg)(0, jnp.arange(length + 1), None, ids_BL, mask_BL)
    selected_BL, _ = check_outputs(ids_BL, mask_BL, out)
    want = [min(6, max(1, round(0.15 * n))) if n > 2 else 0 for n in n_real_B]
    if whole_word:
      assert np.all(selected_BL.sum(1) <= want)
    else:
      assert selected_BL.sum(1).tolist() == want
      # 0.15 * 30 = 4.5 rounds half to even -> 4, as Python's round in the original.
      assert want[30] == 4 and selected_BL[30].sum() == 4


def test_more_predictions_than_positions():
  cfg = masking.MaskingConfig(max_predictions=20, masked_lm_prob=1.0)
  ids_BL, mask_BL = make_batch(4, 8, short_frac=0.0)
  out = jit_mask_batch(cfg)(0, jnp.arange(4), None, ids_BL, mask_BL)
  selected_BL, _ = check_outputs(ids_BL, mask_BL, out)
  assert out["masked_lm_positions"].shape == (4, 20)
  # Every candidate (all but [CLS] and two [SEP]s) is selected.
  assert selected_BL.sum(1).tolist() == [5, 5, 5, 5]


@pytest.mark.parametrize("whole_word", [False, True])
def test_padding_is_never_selected_and_does_not_change_the_mask(whole_word):
  cfg = masking.MaskingConfig(max_predictions=20, masked_lm_prob=0.5, whole_word=whole_word)
  ids_BL, mask_BL = make_batch(64, 64, seed=3, short_frac=1.0)
  # The same rows padded to 128 with ordinary word ids: the padding must never be chosen or
  # touched, and the mask must equal the unpadded one (create_data may mask unpadded rows).
  long_mask_BL = np.pad(mask_BL, ((0, 0), (0, 64)))
  junk_BL = np.where(long_mask_BL > 0, np.pad(ids_BL, ((0, 0), (0, 64))), 2000 + np.arange(128))
  out = jit_mask_batch(cfg)(5, jnp.arange(64), None, ids_BL, mask_BL)
  out_long = jit_mask_batch(cfg)(5, jnp.arange(64), None, junk_BL, long_mask_BL)
  check_outputs(ids_BL, mask_BL, out)
  selected_BL, new_BL = check_outputs(junk_BL, long_mask_BL, out_long)
  assert not selected_BL[long_mask_BL == 0].any()
  assert np.array_equal(new_BL[long_mask_BL == 0], junk_BL[long_mask_BL == 0])
  np.testing.assert_array_equal(out["input_ids"], new_BL[:, :64] * mask_BL)
  for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    np.testing.assert_array_equal(out[k], out_long[k])


def test_static_and_dynamic_keys():
  cfg = masking.MaskingConfig(max_predictions=20)
  ids_BL, mask_BL = make_batch(32, 128, seed=4, short_frac=0.0)
  ids_BL[1:] = ids_BL[0]  # the same tokens in every row: only the key differs
  f = jit_mask_batch(cfg)
  ex_B = jnp.full((32,), 9)

  def positions(out):
    return np.asarray(out["masked_lm_positions"])

  # Static: the epoch is ignored, so every copy of example 9 gets the identical mask; other
  # example ids get different masks.
  static = positions(f(11, ex_B, None, ids_BL, mask_BL))
  assert (static == static[0]).all()
  others = positions(f(11, jnp.arange(32), None, ids_BL, mask_BL))
  assert len({tuple(r) for r in others}) == 32
  # Dynamic: epoch e gives a fresh mask each epoch, reproducible for a given epoch.
  dyn = positions(f(11, ex_B, jnp.arange(32), ids_BL, mask_BL))
  assert len({tuple(r) for r in dyn}) == 32
  dyn_again = positions(f(11, ex_B, jnp.arange(32)[::-1], ids_BL, mask_BL))
  np.testing.assert_array_equal(dyn_again, dyn[::-1])
  # Another seed changes the masks.
  assert not np.array_equal(positions(f(12, ex_B, None, ids_BL, mask_BL))[0], static[0])

  # The key contract: static fold_in(key(seed), id); dynamic fold_in(static, epoch).
  base = jax.random.key(11, impl="threefry2x32")
  static_key = jax.random.fold_in(base, 9)
  data = jax.random.key_data
  np.testing.assert_array_equal(data(masking.example_key(11, 9)), data(static_key))
  np.testing.assert_array_equal(
    data(masking.example_key(11, 9, 3)), data(jax.random.fold_in(static_key, 3))
  )
  # A typed key or a legacy uint32 key as the seed gives the same keys as the int seed.
  np.testing.assert_array_equal(
    data(masking.example_key(base, 9, 3)), data(masking.example_key(11, 9, 3))
  )
  np.testing.assert_array_equal(
    data(masking.example_key(jax.random.PRNGKey(11), 9)), data(static_key)
  )


@pytest.mark.parametrize("whole_word", [False, True])
def test_batch_composition_jit_and_mesh_do_not_change_a_mask(whole_word):
  cfg = masking.MaskingConfig(max_predictions=12, whole_word=whole_word)
  ids_BL, mask_BL = make_batch(16, 64, seed=5, short_frac=0.5)
  ex_B, ep_B = np.arange(100, 116), np.arange(16) % 3
  eager = masking.mask_batch(2, ex_B, ep_B, ids_BL, mask_BL, tables(), cfg)
  jitted = jit_mask_batch(cfg)(2, ex_B, ep_B, ids_BL, mask_BL)
  # A different batch: the first 8 examples reversed, next to 8 other examples.
  ids2, mask2 = make_batch(16, 64, seed=6)
  ids2[:8], mask2[:8] = ids_BL[:8][::-1], mask_BL[:8][::-1]
  ex2, ep2 = np.r_[ex_B[:8][::-1], np.arange(500, 508)], np.r_[ep_B[:8][::-1], np.zeros(8, int)]
  other = jit_mask_batch(cfg)(2, ex2, ep2, ids2, mask2)
  # Sharded over 8 devices inside jit, as in the train step.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",), axis_types=(AxisType.Auto,))
  shard = NamedSharding(mesh, P("data"))
  with jax.set_mesh(mesh):
    args = [jax.device_put(jnp.asarray(a), shard) for a in (ex_B, ep_B, ids_BL, mask_BL)]
    sharded = jit_mask_batch(cfg)(2, *args)
  for k in eager:
    np.testing.assert_array_equal(eager[k], jitted[k])
    np.testing.assert_array_equal(eager[k], sharded[k])
    np.testing.assert_array_equal(np.asarray(eager[k])[:8], np.asarray(other[k])[:8][::-1])
  # Single-example `mask` with example_key is the same function.
  one = masking.mask(masking.example_key(2, 103, 0), ids_BL[3], mask_BL[3], tables(), cfg)
  for k in one:
    np.testing.assert_array_equal(one[k], eager[k][3])


def test_ltr_targets():
  ids = jnp.array([[101, 7, 8, 102, 0], [101, 5, 6, 9, 102]])
  mask = (ids > 0).astype(jnp.int32)
  targets, weights = masking.ltr_targets(ids, mask)
  np.testing.assert_array_equal(targets, [[7, 8, 102, 0, 0], [5, 6, 9, 102, 0]])
  np.testing.assert_array_equal(weights, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
  assert targets.dtype == jnp.int32 and weights.dtype == jnp.float32


def test_tables_from_tokenizer():
  special = np.array([True, False, True, False, False])
  tok = types.SimpleNamespace(
    special_mask=lambda: special,
    word_start_mask=lambda: np.array([True, True, True, False, True]),
    pad_id=0,
    cls_id=2,
    sep_id=2,
    mask_id=0,
  )
  t = masking.tables_from_tokenizer(tok)
  assert t.replace_ids.tolist() == [1, 3, 4] and t.replace_ids.dtype == np.int32
  assert t.word_start.tolist() == [True, True, True, False, True]
  assert (t.pad_id, t.cls_id, t.sep_id, t.mask_id) == (0, 2, 2, 0)
  tok.special_mask = lambda: np.ones(5, bool)
  with pytest.raises(ValueError, match="non-special"):
    masking.tables_from_tokenizer(tok)


def test_tables_can_be_a_jit_argument():
  cfg = masking.MaskingConfig()
  ids_BL, mask_BL = make_batch(8, 32, seed=7)
  f = jax.jit(masking.mask_batch, static_argnums=(0, 6))
  traced = f(1, jnp.arange(8), None, ids_BL, mask_BL, tables(), cfg)
  const = jit_mask_batch(cfg)(1, jnp.arange(8), None, ids_BL, mask_BL)
  for k in traced:
    np.testing.assert_array_equal(traced[k], const[k])


def test_config_validation():
  with pytest.raises(ValueError, match="masked_lm_prob"):
    masking.MaskingConfig(masked_lm_prob=0.0)
  with pytest.raises(ValueError, match="random_frac"):
    masking.MaskingConfig(mask_frac=0.95, random_frac=0.1)
  with pytest.raises(ValueError, match="max_predictions"):
    masking.MaskingConfig(max_predictions=0)
