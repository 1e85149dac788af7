"""The encoder's layers under `nn.scan` (BertConfig.scan_layers): one layer body compiled once
whatever the depth, parameters stacked on a leading layer axis (`layers/layer/...`, [N, ...]).

Built for any layer class with BERT's layer signature, `layer_cls(cfg, deterministic,
output_attentions)(x_BLD, input_mask_BL, positions_BQ) -> (x, attention probabilities)`, which
the encoder hands in: `scanned` runs N layers, `scanned_then_last` the first N - 1 scanned and
the last on its own at the positions asked for (BertConfig.unroll_last_layer, so the pruned
last layer applies) on the same parameter tree.

Shape key: B batch, L sequence length, Q positions the last layer computes, D hidden, N layers.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import sharding as sh
from bert_jax.model_config import REMAT_POLICIES, BertConfig

Array = jax.Array


def remat(layer_cls: Any, cfg: BertConfig, prevent_cse: bool) -> Any:
  """`layer_cls` rematerialised by cfg.remat_policy (as it is for 'none' and 'gelu', which
  rematerialises the GELU alone, inside the layer)."""
  if REMAT_POLICIES[cfg.remat_policy] is None:
    return layer_cls
  return nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=prevent_cse)


@jax.custom_vjp
def recomputed_gelu(x: Array) -> Array:
  """BERT's exact GELU (`model.gelu`) for remat_policy='gelu': only its input is kept for the
  backward, which computes the derivative Phi(x) + x phi(x) from it in float32. A custom VJP
  rather than `jax.checkpoint`, whose optimisation barrier stands between the recomputation
  and its neighbours (a likely cause, not measured, of its 0.97x on a GPU: docs/gpu.md); the
  derivative is written with erf, the forward with erfc, so that XLA's CSE cannot merge the two
  and keep the forward's intermediates alive."""
  return jax.nn.gelu(x, approximate=False)


def _gelu_fwd(x: Array) -> tuple[Array, Array]:
  return recomputed_gelu(x), x


def _gelu_bwd(x: Array, g: Array) -> tuple[Array]:
  xf = x.astype(jnp.float32)
  cdf = 0.5 * (1.0 + jax.lax.erf(xf * math.sqrt(0.5)))
  pdf = jnp.exp(-0.5 * xf * xf) * (1.0 / math.sqrt(2.0 * math.pi))
  return ((g.astype(jnp.float32) * (cdf + xf * pdf)).astype(x.dtype),)


recomputed_gelu.defvjp(_gelu_fwd, _gelu_bwd)


class _Step(nn.Module):
  """One layer with the (carry, per-step output) signature nn.scan needs."""

  layer_cls: Any
  cfg: BertConfig
  deterministic: bool = True
  output_hidden_states: bool = False
  output_attentions: bool = False

  @nn.compact
  def __call__(self, x_BLD: Array, input_mask_BL: Array):
    layer = remat(self.layer_cls, self.cfg, prevent_cse=False)
    x_BLD, probs_BHLS = layer(self.cfg, self.deterministic, self.output_attentions, name="layer")(
      x_BLD, input_mask_BL, None
    )
    return x_BLD, (x_BLD if self.output_hidden_states else None, probs_BHLS)


def scanned(layer_cls: Any, length: int):
  """nn.scan of `length` layers of `layer_cls`: construct it with (cfg, deterministic,
  output_hidden_states, output_attentions), call it on (x_BLD, input_mask_BL); it returns
  (x_BLD, (hidden states [N, B, L, D] or None, probabilities [N, ...] or None))."""
  scan = nn.scan(
    _Step,
    variable_axes={"params": 0},
    split_rngs={"params": True, "dropout": True},
    in_axes=(nn.broadcast,),
    length=length,
    metadata_params={nn.PARTITION_NAME: sh.LAYERS},
  )
  return functools.partial(scan, layer_cls)


class _ScanThenLast(nn.Module):
  """The first N - 1 layers scanned (`scan`), then the last on its own (`last`) at the
  positions asked for: `scanned_then_last` gives it the scanned layers' parameters."""

  layer_cls: Any
  cfg: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BLD: Array, input_mask_BL: Array, positions_BQ: Array) -> Array:
    cfg = self.cfg
    x_BLD, _ = scanned(self.layer_cls, cfg.num_layers - 1)(cfg, self.deterministic, name="scan")(
      x_BLD, input_mask_BL
    )
    last = remat(self.layer_cls, cfg, prevent_cse=True)
    x_BQD, _ = last(cfg, self.deterministic, name="last")(x_BLD, input_mask_BL, positions_BQ)
    return x_BQD


def _is_box(x) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def _split_last(variables):
  """{"layer": [N, ...] leaves} -> {"scan": {"layer": the first N - 1}, "last": the N-th}
  (boxed leaves keep their logical names, the last without the layer axis)."""
  tree = variables.get("params")
  if not tree or "layer" not in tree:
    return variables
  first = lambda x: x.replace_boxed(x.unbox()[:-1]) if _is_box(x) else x[:-1]
  last = lambda x: x.replace(value=x.value[-1], names=x.names[1:]) if _is_box(x) else x[-1]
  return {
    **variables,
    "params": {
      "scan": {"layer": jax.tree.map(first, tree["layer"], is_leaf=_is_box)},
      "last": jax.tree.map(last, tree["layer"], is_leaf=_is_box),
    },
  }


def _join_last(variables):
  """`_split_last`'s inverse: the scanned layers' layout, `layer/...` [N, ...]."""
  tree = variables.get("params")
  if not tree or "scan" not in tree:
    return variables

  def stack(a, b):
    if _is_box(a):
      return a.replace_boxed(jnp.concatenate([a.unbox(), b.unbox()[None]]))
    return jnp.concatenate([a, b[None]])

  layer = jax.tree.map(stack, tree["scan"]["layer"], tree["last"], is_leaf=_is_box)
  return {**variables, "params": {"layer": layer}}


def scanned_then_last(layer_cls: Any, initializing: bool):
  """The first N - 1 layers of `layer_cls` scanned and the last on its own, on the parameters
  of an N-layer `scanned` (the same tree, so a checkpoint of scanned layers runs either way):
  construct it with (cfg, deterministic), call it on (x_BLD, input_mask_BL, positions_BQ); it
  returns the last layer's [B, Q, D]."""
  module = nn.map_variables(
    _ScanThenLast,
    "params",
    trans_in_fn=_split_last,
    trans_out_fn=_join_last,
    init=initializing,
    mutable=initializing,
  )
  return functools.partial(module, layer_cls)
