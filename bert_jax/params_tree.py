"""Param trees as nested dicts of host arrays: the two layer layouts, their checks, placement.

A tree is a BertForPreTraining tree ({"bert", "predictions", "seq_relationship"}), a BertModel
tree ({"embeddings", "encoder", "pooler"}) or a fine-tuned one ({"bert": <BertModel tree>,
"head": {...}}); its encoder is unrolled (`encoder/layer_{i}`) or scanned (`encoder/layers/
layer`, a leading layer axis). `stack_layers`/`unstack_layers` convert between the layouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bert_jax import model as model_lib
from bert_jax.model_config import BertConfig
from bert_jax.trees import flatten, unflatten

Params = dict[str, Any]


def unbox_to_numpy(params: Any) -> Params:
  """Plain nested dicts of host numpy arrays (unboxes Flax partitioning metadata)."""
  params = nn.meta.unbox(params)
  params = jax.tree.map(np.asarray, params)
  return unflatten(flatten(params))


def _encoder(params: Params) -> tuple[Params, str]:
  """(the encoder subtree, "bert/" or "") for a BertForPreTraining or BertModel tree."""
  if "bert" in params:
    return params["bert"]["encoder"], "bert/"
  if "encoder" in params:
    return params["encoder"], ""
  raise ValueError(f"params have neither 'bert' nor 'encoder' at the top: {sorted(params)}")


def is_scanned(params: Params) -> bool:
  return "layers" in _encoder(params)[0]


def is_pretraining(params: Params) -> bool:
  return "bert" in params


def stack_layers(params: Params) -> Params:
  """Unrolled `encoder/layer_{i}` -> scanned `encoder/layers/layer` (leading layer axis)."""
  encoder, _ = _encoder(params)
  if "layers" in encoder:
    return params
  n = len(encoder)
  names = [f"layer_{i}" for i in range(n)]
  if sorted(encoder) != sorted(names):
    raise ValueError(f"encoder has unexpected children {sorted(encoder)}")
  flats = [flatten(encoder[name]) for name in names]
  stacked = {path: np.stack([np.asarray(f[path]) for f in flats]) for path in flats[0]}
  return _replace_encoder(params, {"layers": {"layer": unflatten(stacked)}})


def unstack_layers(params: Params) -> Params:
  """Scanned `encoder/layers/layer` -> unrolled `encoder/layer_{i}`."""
  encoder, _ = _encoder(params)
  if "layers" not in encoder:
    return params
  flat = flatten(encoder["layers"]["layer"])
  n = len(next(iter(flat.values())))
  new = {f"layer_{i}": unflatten({p: np.asarray(x)[i] for p, x in flat.items()}) for i in range(n)}
  return _replace_encoder(params, new)


def _replace_encoder(params: Params, encoder: Params) -> Params:
  params = dict(params)
  if "bert" in params:
    params["bert"] = {**params["bert"], "encoder": encoder}
  else:
    params["encoder"] = encoder
  return params


def to_layout(params: Params, scan_layers: bool) -> Params:
  return stack_layers(params) if scan_layers else unstack_layers(params)


def expected_shapes(cfg: BertConfig, pretraining: bool) -> dict[str, tuple[int, ...]]:
  """Unrolled param path -> shape, straight from the model (eval_shape, no compute)."""
  unrolled = dataclasses.replace(cfg, scan_layers=False, remat_policy="none")
  abstract = model_lib.abstract_params(unrolled, pretraining)
  return {path: tuple(x.shape) for path, x in flatten(abstract).items()}


def check_tree(params: Params, cfg: BertConfig, pretraining: bool, source: str) -> None:
  """Every path and shape exactly as the model with `cfg` expects (unrolled layout)."""
  expected = expected_shapes(cfg, pretraining)
  got = {p: tuple(np.shape(x)) for p, x in flatten(params).items()}
  for path, shape in expected.items():
    if path not in got:
      raise ValueError(f"{source}: missing parameter {path!r}")
    if got[path] != shape:
      raise ValueError(
        f"{source}: parameter {path!r} has shape {got[path]}, but the config implies {shape}"
      )
  for path in got:
    if path not in expected:
      raise ValueError(f"{source}: unexpected parameter {path!r}")


def has_head(params: Any) -> bool:
  """A fine-tuned tree: {"bert": <BertModel params>, "head": {...}}."""
  return isinstance(params, Mapping) and "head" in params


def shapes(tree: Params) -> dict[str, tuple[int, ...]]:
  return {k: tuple(np.shape(x)) for k, x in flatten(tree).items()}


def place(params: Params, target: Any) -> Any:
  """Host arrays -> jax Arrays with the target's dtypes and shardings (any mesh, any host)."""

  def put(x, t):
    x = np.asarray(x).astype(t.dtype)
    if tuple(x.shape) != tuple(t.shape):
      raise ValueError(f"parameter has shape {x.shape}, the target {t.shape}")
    return jax.make_array_from_callback(x.shape, t.sharding, lambda idx: x[idx])

  return jax.tree.map(put, params, target)
