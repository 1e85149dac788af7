"""bert_jax.model: parameter counts, padding invariance, the pruned last layer, dropout, LTR,
bf16, embedding lookups, the padded vocabulary.

The scanned layers and remat (bert_jax.layer_scan) are tested in test_layer_scan.py; the kernels
switch (CPU kernels vs stock XLA ops) in test_backends_cpu.py; the dropout masks in
test_backends_dropout.py, the attention implementations in test_backends_attention.py."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import backends, model_config
from bert_jax import model as model_lib
from bert_jax.backends import attention as attention_lib
from bert_jax.backends import dropout as dropout_lib
from bert_jax.model import BertForPreTraining, BertModel
from bert_jax.model_config import BertConfig
from unit._tiny_bert import TINY, _apply, _batch, _params, random_params

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
  cfg = model_config.config_for_size(size, scan_layers=True)
  assert model_lib.count_params(model_lib.abstract_params(cfg, pretraining)) == expected


def test_scanned_and_unrolled_have_same_count():
  for scan in (False, True):
    cfg = model_config.config_for_size("base", scan_layers=scan)
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
  base = model_config.config_for_size("base")
  off = dataclasses.replace(base, prune_last_layer=False)
  full, pruned = (model_lib.train_flops_per_token(c, 128, 20) for c in (off, base))
  # K/V projections stay at every position; Q, output, FFN and attention at 21 of 128.
  d, f, L = 768, 3072, 128
  saved = (1 - 21 / L) * (6 * (2 * d * d + 2 * d * f) + 12 * d * L)
  np.testing.assert_allclose(full - pruned, saved, rtol=1e-12)
  # Computing all L positions is the unpruned count; scanned layers prune only with the last
  # unrolled.
  assert model_lib.train_flops_per_token(base, 128, 127) == model_lib.train_flops_per_token(
    off, 128, 127
  )
  scan = dataclasses.replace(base, scan_layers=True)
  assert model_lib.train_flops_per_token(scan, 128, 20) == full
  hybrid = dataclasses.replace(scan, unroll_last_layer=True)
  assert model_lib.train_flops_per_token(hybrid, 128, 20) == pruned


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
  mask = attention_lib.attention_mask(jnp.array([[1] * 6, [1] * 4 + [0] * 2]), causal)
  assert mask.shape == (2, 1, 6, 6)
  want, probs = attention_lib.explicit_attention(q, k, v, mask, backends.XLA_OPS)
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
    full = np.asarray(attention_lib.attention_mask(input_mask, causal))
    got = np.asarray(attention_lib.attention_mask(input_mask, causal, positions))
    assert got.shape == (2, 1, 3, 6)
    want = np.take_along_axis(full, np.asarray(positions)[:, None, :, None], axis=2)
    np.testing.assert_array_equal(got, want)
  assert not np.array_equal(  # causal rows differ by position
    attention_lib.attention_mask(input_mask, True, positions)[0, 0, 0],
    attention_lib.attention_mask(input_mask, True, positions)[0, 0, 2],
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


# --- embedding lookups: the float32 tables read without a low-precision scatter --------------


class NNEmbedEmbeddings(nn.Module):
  """The embeddings as they were before the accelerator-cheap lookups (kept as the reference):
  nn.Embed's own lookups, which cast each table to the compute dtype before gathering, so a
  bf16 model's table gradients are bf16 scatter-adds."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    embed = lambda n, names: nn.Embed(
      n,
      cfg.hidden_size,
      embedding_init=model_lib._init(cfg, names),
      param_dtype=cfg.storage_dtype,
      dtype=cfg.compute_dtype,
    )
    self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"))
    self.position_embeddings = embed(cfg.max_position_embeddings, (None, "embed"))
    self.token_type_embeddings = embed(cfg.type_vocab_size, (None, "embed"))
    self.LayerNorm = model_lib.layer_norm(cfg, "LayerNorm")
    self.dropout = dropout_lib.for_config(cfg, cfg.hidden_dropout_prob)

  def __call__(self, input_ids_BL, segment_ids_BL, deterministic):
    x_BLD = self.word_embeddings(input_ids_BL)
    x_BLD = x_BLD + self.position_embeddings(jnp.arange(input_ids_BL.shape[1]))[None]
    x_BLD = x_BLD + self.token_type_embeddings(segment_ids_BL)
    return self.dropout(self.LayerNorm(x_BLD), deterministic=deterministic)

  def attend(self, h_BPD):
    table_VD = self.word_embeddings.embedding
    return backends.ops_for(self.cfg).logits(h_BPD, table_VD, self.cfg.compute_dtype)


def _embedding_values_and_grads(module, params, ids, seg):
  w = np.random.default_rng(5).normal(size=(*ids.shape, module.cfg.hidden_size))

  def loss(p):
    out = module.apply({"params": p}, ids, seg, True)
    return jnp.sum(out.astype(jnp.float32) * w), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return out, grads


@pytest.mark.parametrize(
  "dtype,type_vocab", [("float32", 2), ("float32", 3), ("bfloat16", 2), ("bfloat16", 5)]
)
def test_embedding_lookups_match_nn_embed(dtype, type_vocab):
  """Same parameters (names, shapes, init) and values as nn.Embed's lookups; float32 gradients
  exactly equal, bfloat16 ones equal to its tolerance (nn.Embed sums them in bf16)."""
  cfg = dataclasses.replace(TINY, dtype=dtype, type_vocab_size=type_vocab, kernels="xla")
  new, old = model_lib.Embeddings(cfg), NNEmbedEmbeddings(cfg)
  rng = np.random.default_rng(1)
  # Repeated ids (a word gradient sums several tokens), every token type, padding included.
  ids = rng.integers(0, 12, (3, 16)).astype(np.int32)
  seg = rng.integers(0, type_vocab, (3, 16)).astype(np.int32)
  init = lambda m: m.init(jax.random.key(3), ids, seg, True)["params"]
  jax.tree.map(np.testing.assert_array_equal, init(new), init(old))
  params = random_params(jax.eval_shape(lambda: nn.meta.unbox(init(new))))
  out_new, g_new = _embedding_values_and_grads(new, params, ids, seg)
  out_old, g_old = _embedding_values_and_grads(old, params, ids, seg)
  assert out_new.dtype == out_old.dtype == jnp.dtype(dtype)
  np.testing.assert_array_equal(out_new, out_old)
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    a, b = g_new[name]["embedding"], g_old[name]["embedding"]
    assert a.dtype == b.dtype == jnp.float32
    if dtype == "float32":
      np.testing.assert_array_equal(a, b, err_msg=name)
    else:
      np.testing.assert_allclose(a, b, rtol=0, atol=2e-2 * float(np.abs(b).max()), err_msg=name)
    assert np.abs(np.asarray(a)).max() > 0, name
  jax.tree.map(np.testing.assert_array_equal, g_new["LayerNorm"], g_old["LayerNorm"])


def test_small_table_lookup_is_a_gather():
  table = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)
  ids = jnp.array([[0, 3, 1], [2, 2, 0]])
  got = model_lib.small_table_lookup(table, ids, jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(got, table[ids].astype(jnp.bfloat16))
  one = model_lib.small_table_lookup(table[:1], ids, jnp.float32)
  np.testing.assert_array_equal(one, np.broadcast_to(table[0], (2, 3, 3)))


# --- the tied decoder's vocabulary, padded inside the step -----------------------------------


@pytest.mark.parametrize("kernels_mode", ["xla", "cpu"])
def test_padded_vocabulary_changes_no_loss_prediction_or_parameter(monkeypatch, kernels_mode):
  """With the decoder's table padded to a multiple of 128 inside the step (a GPU's
  `backends.VOCAB_MULTIPLE`, here forced on the CPU), a 200-word model computes its product on
  256 rows and gives the same [B, P, 200] logits, predictions, MLM+NSP loss and gradients as
  unpadded, with parameters of 200 rows: no padded row takes probability or wins an argmax."""
  cfg = dataclasses.replace(TINY, vocab_size=200, kernels=kernels_mode, platform="cpu")
  params = _params(cfg)
  assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (200, 32)
  assert params["predictions"]["bias"].shape == (200,)
  ids, seg, mask = _batch([8, 6], 8, vocab=200)
  positions = np.array([[1, 3, 6], [2, 4, 0]], np.int32)
  targets = np.array([[199, 5, 150], [7, 198, 0]], np.int32)

  def grad_fn():  # a new function per setting (jit caches traces by function)
    def loss(p):
      out = BertForPreTraining(cfg).apply({"params": p}, ids, seg, mask, positions)
      logp = jax.nn.log_softmax(out["mlm_logits"])
      mlm = -jnp.take_along_axis(logp, targets[..., None], -1).mean()
      return mlm - jax.nn.log_softmax(out["nsp_logits"])[:, 1].mean(), out["mlm_logits"]

    return jax.value_and_grad(loss, has_aux=True)

  results = {}
  for multiple in (1, 128):
    monkeypatch.setattr(backends, "VOCAB_MULTIPLE", {"cpu": multiple})
    assert backends.vocab_rows(cfg, 200) == (256 if multiple == 128 else 200)
    grad = grad_fn()
    text = str(jax.make_jaxpr(grad)(params))
    assert ("f32[256,32]" in text) == (multiple == 128)  # the padded table
    results[multiple] = jax.jit(grad)(params)
  ((loss_p, logits_p), grads_p), ((loss_u, logits_u), grads_u) = results[128], results[1]
  assert logits_p.shape == (2, 3, 200)
  np.testing.assert_allclose(logits_p, logits_u, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.argmax(logits_p, -1), np.argmax(logits_u, -1))
  assert float(loss_p) == pytest.approx(float(loss_u), rel=1e-6)
  assert jax.tree.map(jnp.shape, grads_p) == jax.tree.map(jnp.shape, grads_u)
  for x, y in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_u), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  # Targets 198 and 199 (the table's last rows, next to the padding) get their gradient.
  table_grad = grads_p["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert float(jnp.abs(table_grad[198:]).min()) > 0


def test_padded_vocabulary_leaves_the_trained_parameters(monkeypatch):
  """Two steps of the real jitted train step (dropout 0.1, a (2, 2, 2) mesh, vocab 300, the
  CPU kernels) with the decoder padded to 384 rows: the parameters a checkpoint saves have
  the unpadded shapes (300 rows) and the unpadded run's values."""
  from unit.test_backends_cpu import _micro_config, _train_params, _train_step_jaxpr

  c = _micro_config("auto", dropout=0.1)
  c.model.vocab_size = 300  # the batches' ids are below 256
  runs = {}
  for multiple in (1, 128):
    monkeypatch.setattr(backends, "VOCAB_MULTIPLE", {"cpu": multiple})
    runs[multiple] = _train_params(c, 1, mesh_shape=(2, 2, 2))
    assert ("f32[384,128]" in _train_step_jaxpr(c, "cpu")) == (multiple == 128)
  word = runs[128]["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert word.shape == (300, 128) and runs[128]["predictions"]["bias"].shape == (300,)
  assert jax.tree.map(np.shape, runs[128]) == jax.tree.map(np.shape, runs[1])
  for x, y in zip(jax.tree.leaves(runs[128]), jax.tree.leaves(runs[1]), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
