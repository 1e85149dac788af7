"""HuggingFace's names for our params and config: the name table, config.json, state dicts.

Parameter names map 1:1 (`_EMBEDDINGS`, `_LAYER`, `_HEADS` below); only the attention kernels
are reshaped: ours are query/key/value (D, H, K) and attention_output (H, K, D), HF Linear
weights are (out, in). A state dict here is {HF name: numpy array}, as HF's BertForPreTraining
or BertModel holds it (with or without the "bert." prefix; old `LayerNorm.gamma/beta` names
too); Google's TF variable names map onto it (`tf_variables_to_hf_state_dict`). HF's export
writes exactly the keys `save_pretrained` does: the tied `cls.predictions.decoder.{weight,bias}`
are left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax import params_tree
from bert_jax.model_config import BertConfig
from bert_jax.params_tree import Params
from bert_jax.trees import flatten, unflatten

# The name table. Kinds: "copy"; "linear" (HF (out, in) <-> ours (in, out)); "qkv" (HF (H*K, D)
# <-> ours (D, H, K)); "qkv_bias" ((H*K,) <-> (H, K)); "attn_out" (HF (D, H*K) <-> ours (H, K, D)).

_EMBEDDINGS = (  # (our path under BertModel, HF name under BertModel, kind)
  ("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight", "copy"),
  ("embeddings/position_embeddings/embedding", "embeddings.position_embeddings.weight", "copy"),
  ("embeddings/token_type_embeddings/embedding", "embeddings.token_type_embeddings.weight", "copy"),
  ("embeddings/LayerNorm/scale", "embeddings.LayerNorm.weight", "copy"),
  ("embeddings/LayerNorm/bias", "embeddings.LayerNorm.bias", "copy"),
  ("pooler/kernel", "pooler.dense.weight", "linear"),
  ("pooler/bias", "pooler.dense.bias", "copy"),
)
_LAYER = (  # (our path under a layer, HF name under encoder.layer.{i}, kind)
  ("query/kernel", "attention.self.query.weight", "qkv"),
  ("query/bias", "attention.self.query.bias", "qkv_bias"),
  ("key/kernel", "attention.self.key.weight", "qkv"),
  ("key/bias", "attention.self.key.bias", "qkv_bias"),
  ("value/kernel", "attention.self.value.weight", "qkv"),
  ("value/bias", "attention.self.value.bias", "qkv_bias"),
  ("attention_output/kernel", "attention.output.dense.weight", "attn_out"),
  ("attention_output/bias", "attention.output.dense.bias", "copy"),
  ("attention_LayerNorm/scale", "attention.output.LayerNorm.weight", "copy"),
  ("attention_LayerNorm/bias", "attention.output.LayerNorm.bias", "copy"),
  ("intermediate/kernel", "intermediate.dense.weight", "linear"),
  ("intermediate/bias", "intermediate.dense.bias", "copy"),
  ("output/kernel", "output.dense.weight", "linear"),
  ("output/bias", "output.dense.bias", "copy"),
  ("output_LayerNorm/scale", "output.LayerNorm.weight", "copy"),
  ("output_LayerNorm/bias", "output.LayerNorm.bias", "copy"),
)
_HEADS = (  # (our path under BertForPreTraining, HF name, kind)
  ("predictions/transform/kernel", "cls.predictions.transform.dense.weight", "linear"),
  ("predictions/transform/bias", "cls.predictions.transform.dense.bias", "copy"),
  ("predictions/transform_LayerNorm/scale", "cls.predictions.transform.LayerNorm.weight", "copy"),
  ("predictions/transform_LayerNorm/bias", "cls.predictions.transform.LayerNorm.bias", "copy"),
  ("predictions/bias", "cls.predictions.bias", "copy"),
  ("seq_relationship/kernel", "cls.seq_relationship.weight", "linear"),
  ("seq_relationship/bias", "cls.seq_relationship.bias", "copy"),
)
# In HF checkpoints but not separate params here: buffers, and the decoder tied to the word
# embeddings (its bias is `cls.predictions.bias`). from_pretrained ignores them the same way.
_IGNORED_HF = re.compile(
  r"^(bert\.)?embeddings\.position_ids$|^cls\.predictions\.decoder\.(weight|bias)$"
)


def _hf_layout(cfg: BertConfig, pretraining: bool) -> list[tuple[str, str, str]]:
  """(our unrolled path, HF key, kind) for every parameter."""
  prefix_ours, prefix_hf = ("bert/", "bert.") if pretraining else ("", "")
  rows = [(prefix_ours + o, prefix_hf + h, k) for o, h, k in _EMBEDDINGS]
  for i in range(cfg.num_layers):
    rows += [
      (f"{prefix_ours}encoder/layer_{i}/{o}", f"{prefix_hf}encoder.layer.{i}.{h}", k)
      for o, h, k in _LAYER
    ]
  if pretraining:
    rows += list(_HEADS)
  return rows


def _reshape(x: np.ndarray, kind: str, cfg: BertConfig, to_hf: bool) -> np.ndarray:
  """One tensor between HF's layout and ours, by its kind in the name table."""
  h, k, d = cfg.num_heads, cfg.head_dim, cfg.hidden_size
  ways = {  # kind: (HF -> ours, ours -> HF)
    "copy": (lambda t: t, lambda t: t),
    "linear": (lambda t: t.T, lambda t: t.T),
    "qkv": (lambda t: t.T.reshape(d, h, k), lambda t: t.reshape(d, h * k).T),
    "qkv_bias": (lambda t: t.reshape(h, k), lambda t: t.reshape(h * k)),
    "attn_out": (lambda t: t.T.reshape(h, k, d), lambda t: t.reshape(h * k, d).T),
  }
  return ways[kind][to_hf](x)


def _hf_shape(our_shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
  if kind == "copy":
    return tuple(our_shape)
  if kind == "linear":
    return tuple(our_shape[::-1])
  if kind == "qkv":
    d, h, k = our_shape
    return (h * k, d)
  if kind == "qkv_bias":
    return (our_shape[0] * our_shape[1],)
  if kind == "attn_out":
    h, k, d = our_shape
    return (d, h * k)
  raise AssertionError(kind)


_HF_DEFAULTS = dict(
  max_position_embeddings=512,
  type_vocab_size=2,
  hidden_dropout_prob=0.1,
  attention_probs_dropout_prob=0.1,
  layer_norm_eps=1e-12,
  initializer_range=0.02,
)


def config_from_hf(hf: Mapping[str, Any], source: str = "config", **overrides: Any) -> BertConfig:
  """BertConfig from an HF config.json (or Google's bert_config.json) dict.

  `overrides` set bert_jax-only fields (scan_layers, dtype, remat_policy, ...).
  Raises ValueError naming `source` and the key for anything this model cannot represent.
  """
  model_type = hf.get("model_type", "bert")
  if model_type != "bert":
    raise ValueError(f"{source}: model_type {model_type!r} is not 'bert'")
  for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
    if key not in hf:
      raise ValueError(f"{source}: missing key {key!r}")
  checks = (
    # (key, allowed values, HF default); exact-erf GELU is "gelu" in both HF and Google configs.
    ("hidden_act", ("gelu", "gelu_python"), "gelu"),
    ("position_embedding_type", ("absolute",), "absolute"),
    ("tie_word_embeddings", (True,), True),
    ("add_cross_attention", (False,), False),
  )
  for key, allowed, default in checks:
    value = hf.get(key, default)
    if value not in allowed:
      raise ValueError(f"{source}: {key}={value!r} is not supported (only {allowed})")
  get = lambda k: hf.get(k, _HF_DEFAULTS.get(k))
  fields = dict(
    vocab_size=int(hf["vocab_size"]),
    hidden_size=int(hf["hidden_size"]),
    num_layers=int(hf["num_hidden_layers"]),
    num_heads=int(hf["num_attention_heads"]),
    intermediate_size=int(hf.get("intermediate_size", 4 * int(hf["hidden_size"]))),
    max_position_embeddings=int(get("max_position_embeddings")),
    type_vocab_size=int(get("type_vocab_size")),
    hidden_dropout_prob=float(get("hidden_dropout_prob")),
    attention_dropout_prob=float(get("attention_probs_dropout_prob")),
    layer_norm_eps=float(get("layer_norm_eps")),
    initializer_range=float(get("initializer_range")),
    causal=bool(hf.get("is_decoder", False)),
  )
  try:
    return BertConfig(**{**fields, **overrides})
  except (TypeError, ValueError) as e:
    raise ValueError(f"{source}: {e}") from None


def config_to_hf(cfg: BertConfig, pretraining: bool = True) -> dict[str, Any]:
  """The config.json transformers writes for this model (causal maps to is_decoder)."""
  return {
    "architectures": ["BertForPreTraining" if pretraining else "BertModel"],
    "attention_probs_dropout_prob": cfg.attention_dropout_prob,
    "classifier_dropout": None,
    "dtype": "float32",
    "hidden_act": "gelu",
    "hidden_dropout_prob": cfg.hidden_dropout_prob,
    "hidden_size": cfg.hidden_size,
    "initializer_range": cfg.initializer_range,
    "intermediate_size": cfg.intermediate_size,
    "is_decoder": cfg.causal,
    "layer_norm_eps": cfg.layer_norm_eps,
    "max_position_embeddings": cfg.max_position_embeddings,
    "model_type": "bert",
    "num_attention_heads": cfg.num_heads,
    "num_hidden_layers": cfg.num_layers,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": cfg.type_vocab_size,
    "use_cache": True,
    "vocab_size": cfg.vocab_size,
  }


def _normalise_hf_keys(state_dict: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Adds the "bert." prefix when missing; old `LayerNorm.gamma/beta` names -> weight/bias."""
  has_prefix = any(k.startswith("bert.") for k in state_dict)
  out = {}
  for key, value in state_dict.items():
    key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
    key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
    if not has_prefix and not key.startswith("cls."):
      key = "bert." + key
    out[key] = value
  # Some exports keep only the decoder's copy of the output bias.
  if "cls.predictions.bias" not in out and "cls.predictions.decoder.bias" in out:
    out["cls.predictions.bias"] = out["cls.predictions.decoder.bias"]
  return out


def hf_state_dict_to_params(
  state_dict: Mapping[str, np.ndarray],
  cfg: BertConfig,
  pretraining: bool | None = None,
  source: str = "state dict",
) -> Params:
  """HF BERT tensors (numpy) -> our params, in cfg.scan_layers' layout and cfg.param_dtype.

  pretraining: True -> BertForPreTraining tree ({bert, predictions, seq_relationship}; the
  `cls.*` heads must be present); False -> BertModel tree (heads dropped); None -> whichever
  the state dict holds. Errors name `source` and the tensor.
  """
  sd = _normalise_hf_keys(state_dict)
  has_heads = any(k.startswith("cls.") for k in sd)
  if pretraining is None:
    pretraining = has_heads
  rows = _hf_layout(cfg, True)
  used = set()
  flat = {}
  dtype = np.dtype(cfg.storage_dtype)
  for ours, hf, kind in rows:
    if not pretraining:
      if not ours.startswith("bert/"):
        continue
      ours = ours[len("bert/") :]
    if hf not in sd:
      raise ValueError(f"{source}: missing tensor {hf!r}")
    x = np.asarray(sd[hf])
    used.add(hf)
    flat[ours] = (x, kind, hf)
  extra = [k for k in sd if k not in used and not _IGNORED_HF.match(k)]
  if pretraining is False:
    extra = [k for k in extra if not k.startswith("cls.")]
  if extra:
    raise ValueError(f"{source}: unexpected tensor {extra[0]!r} (not part of a BERT checkpoint)")

  expected = params_tree.expected_shapes(cfg, pretraining)
  params_flat = {}
  for ours, (x, kind, hf) in flat.items():
    want = _hf_shape(expected[ours], kind)
    if tuple(x.shape) != want:
      raise ValueError(
        f"{source}: tensor {hf!r} has shape {tuple(x.shape)}, but the config implies {want}"
      )
    if not np.issubdtype(x.dtype, np.floating) and x.dtype.name != "bfloat16":
      raise ValueError(f"{source}: tensor {hf!r} has non-float dtype {x.dtype}")
    params_flat[ours] = np.ascontiguousarray(_reshape(x, kind, cfg, to_hf=False)).astype(dtype)
  params = unflatten(params_flat)
  params_tree.check_tree(params, cfg, pretraining, source)
  return params_tree.to_layout(params, cfg.scan_layers)


def params_to_hf_state_dict(params: Any, cfg: BertConfig) -> dict[str, np.ndarray]:
  """Our params (either layout, boxed or not) -> the float32 tensors `save_pretrained` writes.

  Keys carry the "bert." prefix for a BertForPreTraining tree and none for a BertModel tree (a
  fine-tuned tree: `hf_heads.params_to_hf_state_dict`).
  """
  params = params_tree.unstack_layers(params_tree.unbox_to_numpy(params))
  pretraining = params_tree.is_pretraining(params)
  params_tree.check_tree(params, cfg, pretraining, "params")
  flat = flatten(params)
  sd = {}
  for ours, hf, kind in _hf_layout(cfg, pretraining):
    sd[hf] = np.ascontiguousarray(_reshape(flat[ours], kind, cfg, to_hf=True)).astype(np.float32)
  return sd


def tf_variables_to_hf_state_dict(variables: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Google's TF variable names (bert/encoder/layer_0/attention/self/query/kernel ...) -> HF.

  TF dense kernels are (in, out) and get transposed to HF's (out, in); `output_weights` of the
  NSP head is already (2, D). Optimizer slots and global_step are dropped.
  """
  sd = {}
  for name, value in variables.items():
    parts = name.split("/")
    if any(p in ("adam_m", "adam_v", "global_step") or p.startswith("AdamWeight") for p in parts):
      continue
    value = np.asarray(value)
    last = parts[-1]
    if last == "kernel":
      parts[-1], value = "weight", value.T
    elif last in ("gamma", "output_weights"):
      parts[-1] = "weight"
    elif last in ("beta", "output_bias"):
      parts[-1] = "bias"
    elif last.endswith("_embeddings"):
      parts.append("weight")
    parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in parts]
    key = ".".join(parts)
    sd[key] = value
  return sd
