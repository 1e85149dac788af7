"""bert_jax.layer_scan: scanned layers equal unrolled ones (outputs, hidden states, attentions, the
stacked parameter tree), every remat policy gives the same gradients ('gelu' recomputing only
the FFN's GELU), and scanning all but an unrolled, pruned last layer."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import model as model_lib
from bert_jax import params_tree
from bert_jax.model import BertForPreTraining
from unit._tiny_bert import TINY, _apply, _batch, _loss_fn, _params


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
  for pol in ("dots", "gelu"):
    grads.append(
      params_tree.stack_layers(grad(dataclasses.replace(TINY, remat_policy=pol), params))
    )
  for g in grads:
    assert jax.tree.structure(g) == jax.tree.structure(ref)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), ref, g)
  assert np.abs(np.asarray(ref["seq_relationship"]["kernel"])).max() > 0


def test_the_gelu_policy_keeps_only_the_gelu_input():
  """remat_policy='gelu' (layer_scan.recomputed_gelu): the backward computes the GELU's
  derivative from its input, so of the FFN's [tokens, intermediate] arrays only the GELU's
  input and output (the next dot's input) are kept, not its intermediates (a product, erfc,
  exp); the grads are the same (above)."""
  import contextlib
  import io

  from jax.ad_checkpoint import print_saved_residuals

  params = _params(TINY)

  def ffn_residuals(cfg):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      print_saved_residuals(_loss_fn(cfg), params)
    width = f",{TINY.intermediate_size}]"  # the FFN's, not the MLM head's transform
    return [ln for ln in out.getvalue().splitlines()
            if width in ln.split(" ")[0] and "from the argument" not in ln]  # fmt: skip

  kept = " ".join(ffn_residuals(TINY))
  assert all(f"output of {op}" in kept for op in ("mul", "erfc", "exp")), kept
  gelu = ffn_residuals(dataclasses.replace(TINY, remat_policy="gelu"))
  assert len(gelu) == 2 * TINY.num_layers, gelu
  assert sum("(_gelu_fwd)" in ln for ln in gelu) == TINY.num_layers, gelu
  assert not any(f"output of {op} " in ln for ln in gelu for op in ("mul", "erfc", "exp")), gelu


@pytest.mark.parametrize("remat_policy", ["none", "minimal"])
def test_scanned_layers_with_the_last_unrolled(remat_policy):
  """scan_layers + unroll_last_layer: the scanned layers' parameter tree (init and
  checkpoints); a pretraining step scans N - 1 layers and prunes the last, with the unrolled
  model's logits, loss and gradients; calls without masked positions scan all N."""
  scan = dataclasses.replace(TINY, num_layers=3, scan_layers=True, remat_policy=remat_policy)
  hybrid = dataclasses.replace(scan, unroll_last_layer=True)
  unrolled = dataclasses.replace(scan, scan_layers=False)
  assert hybrid.last_layer_prunable and not scan.last_layer_prunable
  shapes = lambda cfg: jax.tree.map(lambda x: (x.shape, x.dtype), model_lib.abstract_params(cfg))
  assert shapes(hybrid) == shapes(scan)
  model = BertForPreTraining(hybrid)
  ids, seg, mask = _batch([8, 5], 8)
  pos = np.array([[3, 7, 1], [4, 0, 2]], np.int32)
  boxed = model.init(jax.random.key(0), ids, seg, mask, pos)["params"]
  assert jax.tree.map(lambda x: (x.shape, x.dtype), nn.meta.unbox(boxed)) == shapes(scan)
  names = nn.get_partition_spec(boxed)["bert"]["encoder"]["layers"]["layer"]["query"]["kernel"]
  assert names[0] == "layers"

  params = _params(unrolled)
  stacked = params_tree.stack_layers(params)

  def run(cfg, p):
    def loss(p):
      out = BertForPreTraining(cfg).apply({"params": p}, ids, seg, mask, pos)
      return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] ** 2), out

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(p)

  (loss_h, out_h), g_h = run(hybrid, stacked)
  (loss_u, out_u), g_u = run(unrolled, params)
  assert "sequence_output" not in out_h  # pruned
  for key in ("mlm_logits", "nsp_logits"):
    np.testing.assert_allclose(out_h[key], out_u[key], atol=2e-6, rtol=0)
  np.testing.assert_allclose(loss_h, loss_u, rtol=1e-6)
  g_u = params_tree.stack_layers(g_u)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5), g_h, g_u)
  # No masked positions: all N layers scanned, the scanned model's outputs.
  full = _apply(hybrid)(stacked, ids, seg, mask)
  want = _apply(scan)(stacked, ids, seg, mask)
  np.testing.assert_array_equal(full["sequence_output"], want["sequence_output"])
