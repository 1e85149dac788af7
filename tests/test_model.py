"""bert_jax.model: parameter counts, padding invariance, layouts, remat, dropout, LTR, bf16.

The kernels switch (CPU kernels vs stock XLA ops) is tested in test_kernels.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import model as model_lib
from bert_jax import params_tree
from bert_jax.model import BertConfig, BertForPreTraining, BertModel

TINY = BertConfig(
  vocab_size=128,
  hidden_size=32,
  num_layers=2,
  num_heads=4,
  intermediate_size=64,
  max_position_embeddings=32,
)


@functools.cache
def _params(cfg: BertConfig, pretraining: bool = True, seed: int = 0):
  """Random params of the model's exact shapes, drawn in numpy.

  Cheaper than model.init (compiling ~40 truncated-normal inits costs seconds on CPU), and
  every tensor -- biases and LayerNorm too -- is non-trivial, so none can be silently ignored.
  """
  return random_params(model_lib.abstract_params(cfg, pretraining), seed)


def random_params(abstract, seed: int = 0):
  rng = np.random.default_rng(seed)

  def draw(path, x):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return jnp.asarray(1.0 + 0.1 * rng.standard_normal(x.shape), x.dtype)
    return jnp.asarray(0.1 * rng.standard_normal(x.shape), x.dtype)

  return jax.tree_util.tree_map_with_path(draw, abstract)


def _batch(lengths, length, vocab=128, seed=0):
  """Right-padded ids (pads are 0), two segments, mask."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, (len(lengths), length)).astype(np.int32)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
  seg = ((np.arange(length)[None] >= np.array(lengths)[:, None] // 2) * mask).astype(np.int32)
  return ids * mask, seg, mask


def _apply(cfg, pretraining=True, **kw):
  return _jitted_apply(cfg, pretraining, tuple(sorted(kw.items())))


@functools.cache  # one compiled function per config, shared by the tests below
def _jitted_apply(cfg, pretraining, kw):
  model = BertForPreTraining(cfg) if pretraining else BertModel(cfg)
  return jax.jit(lambda p, *a: model.apply({"params": p}, *a, **dict(kw)))


# --- parameter counts (vocab 30,522), from shapes only ---------------------------------------


@pytest.mark.parametrize(
  "size,pretraining,expected",
  [
    ("base", False, 109_482_240),
    ("base", True, 110_106_428),
    ("large", True, 336_226_108),
  ],
)
def test_parameter_counts_match_released_models(size, pretraining, expected):
  cfg = model_lib.config_for_size(size, scan_layers=True)
  assert model_lib.count_params(model_lib.abstract_params(cfg, pretraining)) == expected


def test_scanned_and_unrolled_have_same_count():
  for scan in (False, True):
    cfg = model_lib.config_for_size("base", scan_layers=scan)
    assert model_lib.count_params(model_lib.abstract_params(cfg, True)) == 110_106_428


# --- padding ----------------------------------------------------------------------------------


def test_padding_invariance():
  params = _params(TINY)
  fwd = _apply(TINY)
  ids, seg, mask = _batch([7, 4], 8)
  out = fwd(params, ids, seg, mask)
  for extra in (5,):
    ids2, seg2, mask2 = (np.pad(x, ((0, 0), (0, extra))) for x in (ids, seg, mask))
    # Pad positions hold arbitrary ids too: they must not matter either.
    ids2 = np.where(mask2 == 1, ids2, np.random.default_rng(extra).integers(1, 128, ids2.shape))
    out2 = fwd(params, ids2, seg2, mask2)
    real = mask.astype(bool)
    for key in ("sequence_output", "mlm_logits"):
      a, b = np.asarray(out[key]), np.asarray(out2[key])[:, : ids.shape[1]]
      np.testing.assert_allclose(a[real], b[real], atol=1e-6, rtol=0)
    for key in ("pooled_output", "nsp_logits"):
      np.testing.assert_allclose(out[key], out2[key], atol=1e-6, rtol=0)
  # Sanity: a real token does change the outputs.
  ids3 = ids.copy()
  ids3[0, 1] = (ids3[0, 1] % 127) + 1
  assert (
    np.abs(np.asarray(fwd(params, ids3, seg, mask)["pooled_output"] - out["pooled_output"])).max()
    > 1e-4
  )


def test_no_gradient_from_pad_positions():
  """A loss over real positions has exactly zero gradient wrt what only pads touch."""
  cfg = TINY
  params = _params(cfg, pretraining=False)
  model = BertModel(cfg)
  pad_id = cfg.vocab_size - 1  # a row only pad positions use
  ids, seg, mask = _batch([6, 4], 10, vocab=cfg.vocab_size - 1)
  ids = np.where(mask == 1, ids, pad_id)
  w = np.random.default_rng(0).normal(size=(2, 10, cfg.hidden_size)).astype(np.float32)

  def loss(p):
    out = model.apply({"params": p}, ids, seg, mask)
    real = mask[..., None].astype(np.float32)
    return jnp.sum(out["sequence_output"] * w * real) + jnp.sum(out["pooled_output"] ** 2)

  g = jax.jit(jax.grad(loss))(params)
  g_word = np.asarray(g["embeddings"]["word_embeddings"]["embedding"])
  g_pos = np.asarray(g["embeddings"]["position_embeddings"]["embedding"])
  assert np.all(g_word[pad_id] == 0.0)
  assert np.all(g_pos[6:] == 0.0)  # positions 6.. are padding in every row
  assert np.abs(g_word[ids[0, 0]]).max() > 0 and np.abs(g_pos[:6]).max() > 0


# --- layouts, remat, attention implementations ----------------------------------------------


def test_scan_and_unrolled_equivalent():
  params = _params(TINY)
  scan_cfg = dataclasses.replace(TINY, scan_layers=True)
  stacked = params_tree.stack_layers(params)
  assert stacked["bert"]["encoder"]["layers"]["layer"]["query"]["kernel"].shape == (2, 32, 4, 8)
  ids, seg, mask = _batch([8, 5], 8)
  a = _apply(TINY)(params, ids, seg, mask)
  # Asking for attentions also switches to the explicit-softmax path (a: fused attention).
  b = _apply(scan_cfg, output_hidden_states=True, output_attentions=True)(stacked, ids, seg, mask)
  for key in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
    np.testing.assert_allclose(a[key], b[key], atol=2e-6, rtol=0)
  assert len(b["hidden_states"]) == 3 and len(b["attentions"]) == 2
  np.testing.assert_array_equal(b["hidden_states"][-1], b["sequence_output"])
  probs = np.asarray(b["attentions"][0])  # [B, H, L, L]
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
  assert np.all(probs[1, :, :, 5:] == 0.0)  # nobody attends to padding
  # Structure matches the scanned model's own init, and unstacking is exact.
  abstract = model_lib.abstract_params(scan_cfg)
  assert jax.tree.structure(abstract) == jax.tree.structure(stacked)
  back = params_tree.unstack_layers(stacked)
  assert jax.tree.all(jax.tree.map(np.array_equal, back, jax.tree.map(np.asarray, params)))


def _loss_fn(cfg):
  model = BertForPreTraining(cfg)
  ids, seg, mask = _batch([8, 6], 8)
  pos = np.array([[1, 3], [2, 5]], np.int32)
  targets = np.array([[5, 9], [11, 13]], np.int32)

  def loss(p):
    out = model.apply({"params": p}, ids, seg, mask, pos)
    logp = jax.nn.log_softmax(out["mlm_logits"])
    mlm = -jnp.take_along_axis(logp, targets[..., None], -1).mean()
    nsp = -jax.nn.log_softmax(out["nsp_logits"])[:, 0].mean()
    return mlm + nsp

  return loss


def test_remat_policies_give_identical_grads():
  scan = dataclasses.replace(TINY, scan_layers=True)
  params = _params(TINY)
  stacked = params_tree.stack_layers(params)
  grad = lambda cfg, p: jax.jit(jax.grad(_loss_fn(cfg)))(p)
  ref = grad(scan, stacked)
  grads = [
    grad(dataclasses.replace(scan, remat_policy=pol), stacked) for pol in ("full", "minimal")
  ]
  # Unrolled layers with remat give the same grads too (after restacking).
  grads.append(
    params_tree.stack_layers(grad(dataclasses.replace(TINY, remat_policy="dots"), params))
  )
  for g in grads:
    assert jax.tree.structure(g) == jax.tree.structure(ref)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), ref, g)
  assert np.abs(np.asarray(ref["seq_relationship"]["kernel"])).max() > 0


def test_masked_positions_gather_matches_all_positions():
  params = _params(TINY)
  ids, seg, mask = _batch([8, 6], 8)
  pos = np.array([[0, 7, 2], [5, 1, 1]], np.int32)
  full = _apply(TINY)(params, ids, seg, mask)["mlm_logits"]
  got = _apply(TINY)(params, ids, seg, mask, pos)["mlm_logits"]
  want = np.take_along_axis(np.asarray(full), pos[..., None], 1)
  np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_pruned_last_layer_same_outputs_and_grads(causal):
  """The last layer at [CLS] + the masked positions only: same logits and gradients."""
  on = dataclasses.replace(TINY, causal=causal, prune_last_layer=True)
  off = dataclasses.replace(on, prune_last_layer=False)
  params = _params(TINY)
  ids, seg, mask = _batch([8, 5], 8)
  pos = np.array([[3, 7, 1], [4, 0, 2]], np.int32)

  def run(cfg):
    def loss(p):
      out = BertForPreTraining(cfg).apply({"params": p}, ids, seg, mask, pos)
      return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] ** 2), out

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  (loss_on, out_on), g_on = run(on)
  (loss_off, out_off), g_off = run(off)
  assert "sequence_output" not in out_on and out_off["sequence_output"].shape == (2, 8, 32)
  for key in ("mlm_logits", "nsp_logits"):
    np.testing.assert_allclose(out_on[key], out_off[key], atol=2e-6, rtol=0)
  np.testing.assert_allclose(loss_on, loss_off, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5), g_on, g_off)
  # Every last-layer weight still gets a gradient (keys/values from all positions).
  assert np.abs(np.asarray(g_on["bert"]["encoder"]["layer_1"]["key"]["kernel"])).max() > 0


def test_pruned_last_layer_flops():
  base = model_lib.config_for_size("base")
  off = dataclasses.replace(base, prune_last_layer=False)
  full, pruned = (model_lib.train_flops_per_token(c, 128, 20) for c in (off, base))
  # K/V projections stay at every position; Q, output, FFN and attention at 21 of 128.
  d, f, L = 768, 3072, 128
  saved = (1 - 21 / L) * (6 * (2 * d * d + 2 * d * f) + 12 * d * L)
  np.testing.assert_allclose(full - pruned, saved, rtol=1e-12)
  # Computing all L positions is the unpruned count; scanned layers never prune.
  assert model_lib.train_flops_per_token(base, 128, 127) == model_lib.train_flops_per_token(
    off, 128, 127
  )
  scan = dataclasses.replace(base, scan_layers=True)
  assert model_lib.train_flops_per_token(scan, 128, 20) == full


# --- dropout, causal mask, bf16 ----------------------------------------------------------------


def test_dropout_active_vs_deterministic():
  params = _params(TINY)
  ids, seg, mask = _batch([8, 6], 8)
  model = BertForPreTraining(TINY)
  train = jax.jit(
    lambda p, r: model.apply(
      {"params": p}, ids, seg, mask, deterministic=False, rngs={"dropout": r}
    )
  )
  det = _apply(TINY)(params, ids, seg, mask)["mlm_logits"]
  a = train(params, jax.random.key(1))["mlm_logits"]
  b = train(params, jax.random.key(1))["mlm_logits"]
  c = train(params, jax.random.key(2))["mlm_logits"]
  np.testing.assert_array_equal(a, b)
  assert np.abs(np.asarray(a - det)).max() > 1e-2
  assert np.abs(np.asarray(a - c)).max() > 1e-2
  # With zero dropout rates, train mode is the deterministic function.
  no_drop = dataclasses.replace(TINY, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  out = jax.jit(
    lambda p, r: BertForPreTraining(no_drop).apply(
      {"params": p}, ids, seg, mask, deterministic=False, rngs={"dropout": r}
    )
  )(params, jax.random.key(1))
  np.testing.assert_allclose(out["mlm_logits"], det, atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_causal_mask(causal):
  cfg = dataclasses.replace(TINY, causal=causal)
  params = _params(cfg)
  fwd = _apply(cfg)
  ids, seg, mask = _batch([8, 8], 8)
  t = 4
  ids2 = ids.copy()
  ids2[:, t + 1 :] = (ids2[:, t + 1 :] % 127) + 1  # change only the future
  a = np.asarray(fwd(params, ids, seg, mask)["sequence_output"])
  b = np.asarray(fwd(params, ids2, seg, mask)["sequence_output"])
  if causal:
    np.testing.assert_array_equal(a[:, : t + 1], b[:, : t + 1])
  else:
    assert np.abs(a[:, : t + 1] - b[:, : t + 1]).max() > 1e-3
  assert np.abs(a[:, t + 1 :] - b[:, t + 1 :]).max() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
def test_fused_attention_op_matches_explicit(causal):
  # The fused op (no dropout, no probabilities asked for) and the explicit softmax agree with
  # padding and causal masks.
  kq, kk, kv = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (2, 6, 3, 8)) for key in (kq, kk, kv))
  mask = model_lib.attention_mask(jnp.array([[1] * 6, [1] * 4 + [0] * 2]), causal)
  assert mask.shape == (2, 1, 6, 6)
  want, probs = model_lib.explicit_attention(q, k, v, mask, model_lib.XLA_OPS)
  got = jax.nn.dot_product_attention(q, k, v, mask=mask)
  np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)
  assert np.all(np.asarray(probs)[1, :, :, 4:] == 0.0)  # padding keys are never attended
  if causal:
    assert np.all(np.triu(np.asarray(probs)[0], 1) == 0.0)  # no query attends a later key


def test_attention_mask_at_query_positions():
  """The pruned last layer's mask [B, 1, Q, S]: the rows of the full mask at its positions."""
  input_mask = jnp.array([[1] * 6, [1] * 4 + [0] * 2])
  positions = jnp.array([[0, 3, 5], [2, 2, 1]])
  for causal in (False, True):
    full = np.asarray(model_lib.attention_mask(input_mask, causal))
    got = np.asarray(model_lib.attention_mask(input_mask, causal, positions))
    assert got.shape == (2, 1, 3, 6)
    want = np.take_along_axis(full, np.asarray(positions)[:, None, :, None], axis=2)
    np.testing.assert_array_equal(got, want)
  assert not np.array_equal(  # causal rows differ by position
    model_lib.attention_mask(input_mask, True, positions)[0, 0, 0],
    model_lib.attention_mask(input_mask, True, positions)[0, 0, 2],
  )


def test_bf16_compute_with_fp32_params():
  params = _params(TINY)
  bf16 = dataclasses.replace(TINY, dtype="bfloat16")
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(model_lib.abstract_params(bf16)))
  ids, seg, mask = _batch([8, 6], 8)
  a = _apply(TINY)(params, ids, seg, mask)
  b = _apply(bf16)(params, ids, seg, mask)
  assert b["mlm_logits"].dtype == jnp.float32 and b["nsp_logits"].dtype == jnp.float32
  assert b["sequence_output"].dtype == jnp.bfloat16
  err = np.abs(np.asarray(a["mlm_logits"]) - np.asarray(b["mlm_logits"])).max()
  scale = np.abs(np.asarray(a["mlm_logits"])).max()
  assert 0 < err < 0.05 * scale, (err, scale)
