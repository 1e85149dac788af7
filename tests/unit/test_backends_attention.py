"""bert_jax.backends.attention: every attention implementation `attend` dispatches to gives the
explicit one's outputs and gradients; the library ones where the backend has them."""

import contextlib
import dataclasses
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import ad_checkpoint

from bert_jax import backends
from bert_jax.backends import attention as attention_lib
from bert_jax.model import BertForPreTraining
from bert_jax.model_config import BertConfig
from unit._tiny_bert import TINY, _batch, _params


def test_attention_impl_config():
  with pytest.raises(ValueError, match="^attention_impl must be one of auto, explicit"):
    BertConfig(attention_impl="sdpa")
  for impl in ("xla", "cudnn"):
    with pytest.raises(ValueError, match=f"^attention_impl='{impl}' has no attention dropout"):
      BertConfig(attention_impl=impl, dtype="bfloat16")
    BertConfig(attention_impl=impl, dtype="bfloat16", attention_dropout_prob=0.0)


def _attention_loss(cfg, params, dropout_seed=None, attentions=False):
  """(outputs, grads) of a loss through BertForPreTraining at masked positions (the pruned
  last layer's odd query count, 1 + 2), with dropout from `dropout_seed` if given."""
  model = BertForPreTraining(cfg)
  ids, seg, mask = _batch([8, 5], 8)
  pos = np.array([[1, 3], [2, 4]], np.int32)
  rngs = None if dropout_seed is None else {"dropout": jax.random.key(dropout_seed)}

  def loss(p):
    out = model.apply(
      {"params": p},
      ids,
      seg,
      mask,
      pos,
      deterministic=dropout_seed is None,
      rngs=rngs,
      output_attentions=attentions,
    )
    return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] ** 2), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return out, grads


def _assert_trees_close(a, b, rtol):
  """Leaf by leaf to `rtol` of the leaf's largest value, or of 1% of the tree's largest (the
  key biases' gradients are zero up to rounding: softmax ignores them)."""
  floor = 0.01 * max(float(np.abs(np.asarray(y, np.float32)).max()) for y in jax.tree.leaves(b))
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    atol = rtol * max(np.abs(y).max(), floor, 1e-6)
    np.testing.assert_allclose(x, y, rtol=0, atol=atol, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("dropout_seed", [None, 4])
def test_explicit_lowp_matches_explicit(dtype, dropout_seed):
  """Probabilities kept in the compute dtype: in float32 the same program; in bf16 the same
  forward values and gradients within bf16 tolerance, with and without attention dropout
  (the same masks)."""
  explicit = dataclasses.replace(TINY, dtype=dtype, attention_impl="explicit")
  lowp = dataclasses.replace(explicit, attention_impl="explicit_lowp")
  params = _params(TINY)
  out_e, g_e = _attention_loss(explicit, params, dropout_seed)
  out_l, g_l = _attention_loss(lowp, params, dropout_seed)
  for key in ("mlm_logits", "nsp_logits"):
    if dtype == "float32":
      np.testing.assert_array_equal(out_l[key], out_e[key])
    else:
      _assert_trees_close(out_l[key], out_e[key], 1e-2)
  if dtype == "float32":
    jax.tree.map(np.testing.assert_array_equal, g_l, g_e)
  else:
    _assert_trees_close(g_l, g_e, 3e-2)
  # output_attentions still returns float32 probabilities (from 'explicit').
  out_a, _ = _attention_loss(lowp, params, dropout_seed, attentions=True)
  assert out_a["attentions"][0].dtype == jnp.float32


def test_attention_probs_kernel_matches_autodiff_and_saves_low_precision():
  """attention_lib.attention_probs: forward = dropout(softmax).astype(bf16) exactly; gradient =
  autodiff's with p rounded to bf16; the backward keeps no float32 [B, H, Q, S] residual
  (the explicit formulation keeps one)."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(3 * rng.normal(size=(2, 3, 5, 8)), jnp.float32)
  keep = jnp.asarray(rng.random((2, 3, 5, 8)) > 0.1)
  g = jnp.asarray(rng.normal(size=(2, 3, 5, 8)), jnp.bfloat16)

  def ref(x, keep=keep):
    p = jax.nn.softmax(x, axis=-1)
    return jax.lax.select(keep, p / 0.9, jnp.zeros_like(p)).astype(jnp.bfloat16)

  for k, rate in ((keep, 0.1), (None, 0.0)):
    ours = lambda x, k=k, rate=rate: attention_lib.attention_probs(x, jnp.bfloat16, k, rate)
    want = ref if k is not None else lambda x: jax.nn.softmax(x, -1).astype(jnp.bfloat16)
    y, vjp = jax.vjp(ours, logits)
    y_ref, vjp_ref = jax.vjp(want, logits)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y, y_ref)
    (dx,), (dx_ref,) = vjp(g), vjp_ref(g)
    assert dx.dtype == jnp.float32
    np.testing.assert_allclose(dx, dx_ref, rtol=0, atol=1e-2 * float(np.abs(dx_ref).max()))
    assert "f32[2,3,5,8]" not in _saved_residuals(ours, logits)
    assert "bf16[2,3,5,8]" in _saved_residuals(ours, logits)
    assert "f32[2,3,5,8]" in _saved_residuals(want, logits)


def _saved_residuals(f, *args) -> list[str]:
  """The types of what f's backward keeps ('f32[2,3,5,8]', ...), from JAX's public printer
  (jax.ad_checkpoint has no public list form in every version the code supports)."""
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    ad_checkpoint.print_saved_residuals(f, *args)
  return [line.split()[0] for line in buf.getvalue().splitlines() if line.strip()]


def test_library_attention_implementations(monkeypatch):
  """attention_impl='xla' and 'cudnn' call jax.nn.dot_product_attention with that
  implementation (cuDNN cannot run here: the call is recorded, then run by XLA), the pruned
  last layer's odd query count padded to an even one for cuDNN; both match 'explicit'."""
  params = _params(TINY)
  calls = []
  real = jax.nn.dot_product_attention

  def record(q, k, v, *, mask, implementation):
    calls.append((implementation, q.shape[1], k.shape[1]))
    return real(q, k, v, mask=mask, implementation="xla")

  monkeypatch.setattr(jax.nn, "dot_product_attention", record)
  # As in a process with a CUDA GPU (without one, 'cudnn' takes 'xla': backends.cudnn_unavailable).
  gpu = type("Gpu", (), {"device_kind": "NVIDIA H200", "compute_capability": "9.0"})
  monkeypatch.setattr(backends, "_local_gpu", gpu)
  base = dataclasses.replace(TINY, dtype="bfloat16", attention_dropout_prob=0.0)
  out_e, g_e = _attention_loss(dataclasses.replace(base, attention_impl="explicit"), params, 1)
  assert calls == []
  for impl in ("xla", "cudnn"):
    out, g = _attention_loss(dataclasses.replace(base, attention_impl=impl), params, 1)
    # Layer 0 at all 8 positions; the last layer at 1 + 2 queries (cuDNN: padded to 4).
    assert calls == [(impl, 8, 8), (impl, 4 if impl == "cudnn" else 3, 8)], calls
    calls.clear()
    _assert_trees_close(out["mlm_logits"], out_e["mlm_logits"], 2e-2)
    _assert_trees_close(g, g_e, 5e-2)


def test_resume_refuses_a_dropout_rng_change():
  """A resume that changes dropout_rng would draw other masks than the uninterrupted run:
  refused; attention_impl computes the same math: reported."""
  from bert_jax.runtime import resume

  stored = {"config": {"model": {"dropout_rng": "hash", "attention_impl": "explicit"}}}
  meta = {"tokenizer": {"fingerprint": "x"}}
  now = {"model": {"dropout_rng": "hash", "attention_impl": "explicit_lowp"}}
  lines = resume.check(stored, now, meta, "wd")
  assert lines == [
    "Resume changes that keep it exact: model.attention_impl 'explicit' -> 'explicit_lowp'"
  ]
  now["model"]["dropout_rng"] = "threefry"
  with pytest.raises(ValueError, match="model.dropout_rng 'hash' -> 'threefry'"):
    resume.check(stored, now, meta, "wd")
