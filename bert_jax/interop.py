"""Checkpoints in and out: one loader for every format, and HuggingFace/params-dir writers.

`load_checkpoint(path, step=None, ...)` is behind `bert_jax.load`, `config.init_from` and
`python -m bert_jax.convert --src`. The format is read from the files, never from names:

  workdir   checkpoints/<step>/ written by training (latest step, or `step=`), tokenizer/
  orbax     one step directory of a workdir: <step>/{params, meta, ...}
  tf        Google's release: bert_config.json + bert_model.ckpt.index (needs the `tf` extra)
  bert_jax  bert_config.json (BertConfig fields) + params.safetensors ("/"-joined param paths)
  hf        config.json + model.safetensors, pytorch_model.bin (read with
            torch.load(weights_only=True)), or a sharded `*.index.json`; BertModel or
            BertForPreTraining weights, with or without the "bert." prefix.
Fine-tuned models: a params dir whose params are {"bert": <BertModel tree>, "head": {...}} plus
task.json ({"kind", "labels", "task", "max_seq_length"}), and HF's
BertForSequenceClassification (classification; regression with problem_type "regression"),
BertForTokenClassification (tagging), BertForQuestionAnswering (span_qa) and
BertForMultipleChoice, labels as id2label. The loader returns the encoder as `params` and the
head and task beside it; export and import keep both (HF kernels are [N, D], ours [D, N]).
A tokenizer found beside the weights comes along (bert_jax's tokenizer/ directory; HuggingFace's
/ Google's vocab.txt with tokenizer_config.json's do_lower_case; an exported spm.model); its
vocab size must equal the weights'.

HF export writes exactly the keys `save_pretrained` does, so
`transformers.BertForPreTraining.from_pretrained(dir)` loads it with no missing or unexpected
keys (the tied `cls.predictions.decoder.{weight,bias}` are left out), and the tokenizer in
HuggingFace's own files: tokenizer_config.json, special_tokens_map.json and a `tokenizers`
tokenizer.json, with vocab.txt for WordPiece (BertTokenizerFast; its BertNormalizer differs from
BERT's rules only on characters BERT keeps and it drops: private-use, unassigned, see
bert_jax/tokenizer.py) or spm.model for a unigram SentencePiece model (PreTrainedTokenizerFast
over an equal `tokenizers` Unigram). A SentencePiece BPE model has no such equivalent: one-line
error, and `convert --tokenizer=false` exports the weights alone.

Parameter names map 1:1 (`_EMBEDDINGS`, `_LAYER`, `_HEADS` below); only the attention kernels
are reshaped: ours are query/key/value (D, H, K) and attention_output (H, K, D), HF Linear
weights are (out, in). Params are nested dicts of numpy arrays, in the unrolled (`layer_{i}`)
or scanned (`layers/layer`, leading layer axis) layout; `stack_layers`/`unstack_layers`
convert between them. Outputs are written to a temp dir and renamed at the end, so a failed
conversion leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bert_jax import checkpoints as ckpt_lib
from bert_jax import model as model_lib
from bert_jax import tokenizer as tokenizer_lib
from bert_jax.model import BertConfig

Params = dict[str, Any]
PathLike = str | os.PathLike

# ---------------------------------------------------------------------------------------------
# The name table. Kinds: "copy"; "linear" (HF (out, in) <-> ours (in, out)); "qkv" (HF (H*K, D)
# <-> ours (D, H, K)); "qkv_bias" ((H*K,) <-> (H, K)); "attn_out" (HF (D, H*K) <-> ours (H, K, D)).
# ---------------------------------------------------------------------------------------------

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

HF_WEIGHTS = "model.safetensors"
HF_CONFIG = "config.json"
PARAMS_FILE = "params.safetensors"
PARAMS_CONFIG = "bert_config.json"  # also the name Google's TF release uses for its config
TF_CKPT = "bert_model.ckpt"
TOKENIZER_DIR = "tokenizer"  # bert_jax's own tokenizer directory in workdirs and params dirs


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


# ---------------------------------------------------------------------------------------------
# Param trees.
# ---------------------------------------------------------------------------------------------


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"a": {"b": x}} -> {"a/b": x}."""
  out = {}
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(flatten(value, path + "/"))
    else:
      out[path] = value
  return out


def unflatten(flat: Mapping[str, Any]) -> Params:
  """{"a/b": x} -> {"a": {"b": x}}."""
  tree: Params = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def _unbox_to_numpy(params: Any) -> Params:
  """Plain nested dicts of host numpy arrays (unboxes Flax partitioning metadata)."""
  import flax.linen as nn
  import jax

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


def _expected_shapes(cfg: BertConfig, pretraining: bool) -> dict[str, tuple[int, ...]]:
  """Unrolled param path -> shape, straight from the model (eval_shape, no compute)."""
  unrolled = dataclasses.replace(cfg, scan_layers=False, remat_policy="none")
  abstract = model_lib.abstract_params(unrolled, pretraining)
  return {path: tuple(x.shape) for path, x in flatten(abstract).items()}


def _check_tree(params: Params, cfg: BertConfig, pretraining: bool, source: str) -> None:
  """Every path and shape exactly as the model with `cfg` expects (unrolled layout)."""
  expected = _expected_shapes(cfg, pretraining)
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


# ---------------------------------------------------------------------------------------------
# Config.
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Fine-tuned models: params {"bert": <BertModel tree>, "head": {...}} and a task.json.
# ---------------------------------------------------------------------------------------------

TASK_FILE = "task.json"
TASK_KINDS = ("classification", "regression", "tagging", "span_qa", "multiple_choice")
_TASK_HF = {  # kind: (HF architecture, the head's Dense name, in ours and in HF)
  "classification": ("BertForSequenceClassification", "classifier"),
  "regression": ("BertForSequenceClassification", "classifier"),
  "tagging": ("BertForTokenClassification", "classifier"),
  "span_qa": ("BertForQuestionAnswering", "qa_outputs"),
  "multiple_choice": ("BertForMultipleChoice", "classifier"),
}
# HF builds these on BertModel(add_pooling_layer=False): their files hold no pooler, and
# from_pretrained reports one as an unexpected key.
_NO_POOLER = ("tagging", "span_qa")
_LABELLED = ("classification", "tagging")  # kinds whose outputs are named by task["labels"]


def has_head(params: Any) -> bool:
  """A fine-tuned tree: {"bert": <BertModel params>, "head": {...}}."""
  return isinstance(params, Mapping) and "head" in params


def check_task(task: Any, source: str) -> dict[str, Any]:
  """A task.json dict checked (a known kind; labels: distinct strings, at least 2 for
  classification and 1 for tagging, none for the other kinds); other keys are kept."""
  if not isinstance(task, Mapping):
    raise ValueError(f"{source}: a task must be a JSON object, not {type(task).__name__}")
  kind = task.get("kind")
  if kind not in TASK_KINDS:
    raise ValueError(f"{source}: unknown task kind {kind!r} (one of {', '.join(TASK_KINDS)})")
  labels = task.get("labels", [])
  if not isinstance(labels, list | tuple) or not all(isinstance(x, str) for x in labels):
    raise ValueError(f"{source}: 'labels' must be a list of strings, not {labels!r}")
  if len(set(labels)) != len(labels):
    dup = next(x for x in labels if labels.count(x) > 1)
    raise ValueError(f"{source}: label {dup!r} appears twice in 'labels'")
  least = {"classification": 2, "tagging": 1}.get(kind, 0)
  if kind in _LABELLED and len(labels) < least:
    raise ValueError(f"{source}: a {kind} task needs at least {least} labels, got {len(labels)}")
  if kind not in _LABELLED and labels:
    raise ValueError(f"{source}: a {kind} task has no labels, got {len(labels)}")
  return {**task, "labels": list(labels)}


def num_outputs(task: Mapping[str, Any]) -> int:
  """The head's output size: one per label; 1 for regression and multiple choice (a score per
  choice); 2 for span QA (start, end)."""
  kind = task["kind"]
  return len(task["labels"]) if kind in _LABELLED else {"span_qa": 2}.get(kind, 1)


def check_head(
  head: Any, task: Mapping[str, Any], hidden_size: int, source: str, exact: bool = False
) -> None:
  """The head's output Dense has kernel [D, N] and bias [N], N = num_outputs(task).

  exact: the head is that Dense alone (what HF's classes hold); otherwise other head layers
  (e.g. a BiLSTM under it) may sit beside it, and only N is checked when they do."""
  kind = task["kind"]
  arch, name = _TASK_HF[kind]
  layer = head.get(name) if isinstance(head, Mapping) else None
  if not isinstance(layer, Mapping) or set(layer) != {"kernel", "bias"}:
    got = sorted(flatten(head)) if isinstance(head, Mapping) else type(head).__name__
    raise ValueError(f"{source}: a {kind} head needs head/{name}/{{kernel,bias}}, got {got}")
  others = sorted(k for k in head if k != name)
  if exact and others:
    raise ValueError(f"{source}: HF {arch} has no place for head/{others[0]} (head/{name} only)")
  n = num_outputs(task)
  kernel, bias = tuple(np.shape(layer["kernel"])), tuple(np.shape(layer["bias"]))
  d = kernel[0] if others and kernel else hidden_size
  if kernel != (d, n) or bias != (n,):
    what = f"{n} labels" if kind in _LABELLED else f"{n} output(s)"
    raise ValueError(
      f"{source}: head/{name} has kernel {kernel} and bias {bias}, but a {kind} task with "
      f"{what} needs ({d}, {n}) and ({n},)"
    )


def read_task(directory: PathLike) -> dict[str, Any] | None:
  """The checked task.json of a params dir, or None when it has none."""
  path = pathlib.Path(directory) / TASK_FILE
  return check_task(_read_json(path), str(path)) if path.is_file() else None


def task_to_hf_config(task: Mapping[str, Any]) -> dict[str, Any]:
  """The config.json keys that make transformers build the task's head class."""
  kind = task["kind"]
  out: dict[str, Any] = {"architectures": [_TASK_HF[kind][0]]}
  if task.get("task"):
    out["finetuning_task"] = task["task"]
  if kind in _LABELLED or kind == "regression":
    labels = task["labels"] if kind in _LABELLED else ["LABEL_0"]  # HF's name for output 0
    out["id2label"] = {str(i): label for i, label in enumerate(labels)}
    out["label2id"] = {label: i for i, label in enumerate(labels)}
    out["num_labels"] = len(labels)
  if kind == "regression":
    out["problem_type"] = "regression"
  # span QA keeps HF's default of 2 labels (its qa_outputs size); BertForMultipleChoice's
  # classifier has 1 output whatever num_labels says.
  return out


def task_from_hf_config(hf: Mapping[str, Any], source: str) -> dict[str, Any] | None:
  """The task of an HF fine-tuned BERT (its architectures name one of the four head classes);
  None for BertModel / BertForPreTraining configs."""
  archs = hf.get("architectures") or []
  arch = next((a for a in archs if a in {a for a, _ in _TASK_HF.values()}), None)
  if arch is None:
    return None
  id2label = hf.get("id2label") or {"0": "LABEL_0", "1": "LABEL_1"}  # HF's default
  try:
    labels = [str(id2label[str(i)]) for i in range(len(id2label))]
  except KeyError:
    raise ValueError(f"{source}: id2label keys must be 0..{len(id2label) - 1}") from None
  problem = hf.get("problem_type")
  if problem not in (None, "regression", "single_label_classification"):
    raise ValueError(f"{source}: problem_type {problem!r} is not supported")
  if arch == "BertForSequenceClassification":
    # HF's own rule: one label and no problem_type is regression.
    regression = problem == "regression" or (problem is None and len(labels) == 1)
    kind = "regression" if regression else "classification"
  elif arch == "BertForTokenClassification":
    kind = "tagging"
  elif arch == "BertForQuestionAnswering":
    kind = "span_qa"
    if len(labels) != 2:
      raise ValueError(f"{source}: {arch} with {len(labels)} labels (a span head has 2)")
  else:
    kind = "multiple_choice"
  task = {
    "kind": kind,
    "labels": labels if kind in _LABELLED else [],
    "task": hf.get("finetuning_task"),
    "max_seq_length": None,  # HF keeps no record of it
  }
  return check_task(task, source)


def _head_to_hf(head: Params, task: Mapping[str, Any]) -> dict[str, np.ndarray]:
  name = _TASK_HF[task["kind"]][1]
  kernel, bias = np.asarray(head[name]["kernel"]), np.asarray(head[name]["bias"])
  return {
    f"{name}.weight": np.ascontiguousarray(kernel.T).astype(np.float32),
    f"{name}.bias": np.ascontiguousarray(bias).astype(np.float32),
  }


def _fresh_pooler(cfg: BertConfig) -> dict[str, np.ndarray]:
  """A pooler for an HF token-level model, which has none: HF's init (normal with
  initializer_range, zero bias), seeded so a load is reproducible. Tagging and span QA never
  read it; it is there so the encoder is a whole BertModel."""
  d = cfg.hidden_size
  rng = np.random.default_rng(0)
  weight = (cfg.initializer_range * rng.standard_normal((d, d))).astype(np.float32)
  return {"bert.pooler.dense.weight": weight, "bert.pooler.dense.bias": np.zeros(d, np.float32)}


def _hf_finetuned_to_params(
  sd: Mapping[str, np.ndarray], cfg: BertConfig, task: Mapping[str, Any], source: str
) -> Params:
  """An HF fine-tuned state dict -> {"bert": <BertModel tree>, "head": {...}}."""
  arch, name = _TASK_HF[task["kind"]]
  sd = dict(sd)
  head_sd = {}
  for suffix in ("weight", "bias"):
    key = f"{name}.{suffix}"
    if key not in sd:
      raise ValueError(f"{source}: missing tensor {key!r} (an HF {arch})")
    head_sd[suffix] = np.asarray(sd.pop(key), np.float32)
  n = num_outputs(task)
  if head_sd["weight"].shape != (n, cfg.hidden_size) or head_sd["bias"].shape != (n,):
    what = f"{n} labels (id2label)" if task["kind"] in _LABELLED else f"{n} output(s)"
    raise ValueError(
      f"{source}: tensors {name}.weight {tuple(head_sd['weight'].shape)} and {name}.bias "
      f"{tuple(head_sd['bias'].shape)}, but {what} need ({n}, {cfg.hidden_size}) and ({n},)"
    )
  if task["kind"] in _NO_POOLER and not any(k.endswith("pooler.dense.weight") for k in sd):
    sd.update(_fresh_pooler(cfg))
  bert = hf_state_dict_to_params(sd, cfg, pretraining=False, source=source)
  head = {name: {"kernel": np.ascontiguousarray(head_sd["weight"].T), "bias": head_sd["bias"]}}
  return {"bert": bert, "head": head}


# ---------------------------------------------------------------------------------------------
# HF state dicts <-> params.
# ---------------------------------------------------------------------------------------------


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

  expected = _expected_shapes(cfg, pretraining)
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
  _check_tree(params, cfg, pretraining, source)
  return to_layout(params, cfg.scan_layers)


def params_to_hf_state_dict(
  params: Any, cfg: BertConfig, task: Mapping[str, Any] | None = None
) -> dict[str, np.ndarray]:
  """Our params (either layout, boxed or not) -> the float32 tensors `save_pretrained` writes.

  Keys carry the "bert." prefix for a BertForPreTraining tree and none for a BertModel tree. A
  fine-tuned tree ({"bert", "head"}) needs its `task`: the kind picks the HF class, whose keys
  are "bert.*" (no pooler for tagging and span QA) and classifier.* or qa_outputs.*.
  """
  params = _unbox_to_numpy(params)
  if has_head(params):
    if task is None:
      raise ValueError("params have a 'head' but no task was given (its kind picks the HF class)")
    task = check_task(task, "task")
    check_head(params["head"], task, cfg.hidden_size, "params", exact=True)
    body = params_to_hf_state_dict(params["bert"], cfg)
    sd = {f"bert.{k}": v for k, v in body.items()}
    if task["kind"] in _NO_POOLER:
      sd = {k: v for k, v in sd.items() if not k.startswith("bert.pooler.")}
    return {**sd, **_head_to_hf(params["head"], task)}
  if task is not None:
    raise ValueError(f"a {task.get('kind')} task was given but the params have no 'head'")
  params = unstack_layers(params)
  pretraining = is_pretraining(params)
  _check_tree(params, cfg, pretraining, "params")
  flat = flatten(params)
  sd = {}
  for ours, hf, kind in _hf_layout(cfg, pretraining):
    sd[hf] = np.ascontiguousarray(_reshape(flat[ours], kind, cfg, to_hf=True)).astype(np.float32)
  return sd


# ---------------------------------------------------------------------------------------------
# Files.
# ---------------------------------------------------------------------------------------------


def _read_json(path: pathlib.Path) -> dict[str, Any]:
  if not path.is_file():
    raise FileNotFoundError(f"{path}: no such file")
  try:
    data = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(data, dict):
    raise ValueError(f"{path}: expected a JSON object")
  return data


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError
  from safetensors.numpy import load_file

  if not path.is_file():
    raise FileNotFoundError(f"{path}: no such file")
  try:
    return load_file(str(path))
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    msg = " ".join(str(e).split())
    raise ValueError(f"{path}: cannot read safetensors ({msg})") from None


def _read_torch_bin(path: pathlib.Path) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    raise ImportError(
      f"{path}: reading a PyTorch .bin checkpoint needs torch (pip install torch), "
      "or convert it to model.safetensors"
    ) from None
  try:
    # weights_only: tensors and plain containers only, never arbitrary pickled code.
    sd = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises many types for a bad file
    msg = " ".join(str(e).split())[:300]
    raise ValueError(f"{path}: cannot read PyTorch checkpoint ({msg})") from None
  if not isinstance(sd, Mapping):
    raise ValueError(f"{path}: expected a state dict, got {type(sd).__name__}")
  sd = sd.get("state_dict", sd)
  return {k: v.detach().float().numpy() for k, v in sd.items() if hasattr(v, "detach")}


def _read_sharded(index: pathlib.Path, read: Callable) -> dict[str, np.ndarray]:
  data = _read_json(index)
  weight_map = data.get("weight_map")
  if not isinstance(weight_map, dict):
    raise ValueError(f"{index}: missing 'weight_map'")
  out = {}
  for shard in sorted(set(weight_map.values())):
    out.update(read(index.parent / shard))
  return out


def read_hf_state_dict(directory: PathLike) -> tuple[dict[str, np.ndarray], pathlib.Path]:
  """All tensors of an HF checkpoint directory, and the file they came from (for messages)."""
  d = pathlib.Path(directory)
  candidates = (
    ("model.safetensors", _read_safetensors, False),
    ("model.safetensors.index.json", _read_safetensors, True),
    ("pytorch_model.bin", _read_torch_bin, False),
    ("pytorch_model.bin.index.json", _read_torch_bin, True),
  )
  for name, read, sharded in candidates:
    path = d / name
    if path.is_file():
      return (_read_sharded(path, read) if sharded else read(path)), path
  raise FileNotFoundError(f"{d}: no model.safetensors or pytorch_model.bin")


def load_hf(
  directory: PathLike, pretraining: bool | None = None, **overrides: Any
) -> tuple[BertConfig, Params]:
  """(cfg, params) from an HF BERT directory; overrides set e.g. scan_layers=True.

  A fine-tuned model (config.json's architectures: BertForSequenceClassification,
  BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice) gives
  {"bert", "head"} unless `pretraining=False` asks for the BertModel tree alone; its task:
  `task_from_hf_config`."""
  d = pathlib.Path(directory)
  if not d.is_dir():
    raise FileNotFoundError(f"{d}: no such directory")
  cfg_path = d / HF_CONFIG
  hf = _read_json(cfg_path)
  cfg = config_from_hf(hf, str(cfg_path), **overrides)
  task = task_from_hf_config(hf, str(cfg_path))
  sd, path = read_hf_state_dict(d)
  if task is not None and pretraining is not True:
    params = _hf_finetuned_to_params(sd, cfg, task, str(path))
    return cfg, (params if pretraining is None else params["bert"])
  return cfg, hf_state_dict_to_params(sd, cfg, pretraining, str(path))


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


def load_tf(path: PathLike, **overrides: Any) -> tuple[BertConfig, Params]:
  """(cfg, params) from Google's release dir (bert_config.json + bert_model.ckpt.*)."""
  p = pathlib.Path(path)
  directory, prefix = (p, p / TF_CKPT) if p.is_dir() else (p.parent, p)
  if not pathlib.Path(f"{prefix}.index").is_file():
    raise FileNotFoundError(f"{prefix}.index: no such file")
  cfg_path = directory / PARAMS_CONFIG
  cfg = config_from_hf(_read_json(cfg_path), str(cfg_path), **overrides)
  try:
    import tensorflow as tf
  except ImportError:
    raise ImportError(
      f"{prefix}: reading a TensorFlow checkpoint needs tensorflow (pip install 'bert_jax[tf]')"
    ) from None
  reader = tf.train.load_checkpoint(str(prefix))
  variables = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(str(prefix))}
  sd = tf_variables_to_hf_state_dict(variables)
  return cfg, hf_state_dict_to_params(sd, cfg, None, str(prefix))


class _AtomicDir:
  """Writes into a temp dir beside `dst` and renames it into place only on success."""

  def __init__(self, dst: PathLike, overwrite: bool):
    self.dst = pathlib.Path(dst)
    self.overwrite = overwrite

  def __enter__(self) -> pathlib.Path:
    if self.dst.exists() and not self.overwrite:
      raise FileExistsError(f"{self.dst}: already exists (pass overwrite=True / --overwrite)")
    self.dst.parent.mkdir(parents=True, exist_ok=True)
    self.tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{self.dst.name}.tmp-", dir=self.dst.parent))
    return self.tmp

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is not None:
      shutil.rmtree(self.tmp, ignore_errors=True)
      return
    # mkdtemp and safetensors create owner-only modes: give the output the usual umask ones.
    umask = os.umask(0)
    os.umask(umask)
    for root, _dirs, files in os.walk(self.tmp):
      os.chmod(root, 0o777 & ~umask)
      for name in files:
        os.chmod(os.path.join(root, name), 0o666 & ~umask)
    old = None
    if self.dst.exists():
      old = self.dst.parent / f".{self.dst.name}.old-{os.getpid()}"
      os.rename(self.dst, old)
    os.rename(self.tmp, self.dst)
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)


def save_hf(
  directory: PathLike,
  cfg: BertConfig,
  params: Any,
  overwrite: bool = False,
  tokenizer: tokenizer_lib.Tokenizer | None = None,
  task: Mapping[str, Any] | None = None,
) -> None:
  """config.json + model.safetensors that transformers' from_pretrained loads cleanly, and the
  tokenizer (if given) in HuggingFace's files. Fine-tuned params ({"bert", "head"}) with their
  `task` write BertForSequenceClassification (classification, regression),
  BertForTokenClassification, BertForQuestionAnswering or BertForMultipleChoice, labels as
  id2label/label2id."""
  from safetensors.numpy import save_file

  sd = params_to_hf_state_dict(params, cfg, task)  # validates before anything is written
  hf_cfg = config_to_hf(cfg, pretraining=any(k.startswith("cls.") for k in sd))
  if task is not None:
    hf_cfg.update(task_to_hf_config(check_task(task, "task")))
  tok_files = {} if tokenizer is None else hf_tokenizer_files(tokenizer, cfg)
  with _AtomicDir(directory, overwrite) as tmp:
    (tmp / HF_CONFIG).write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
    save_file(sd, str(tmp / HF_WEIGHTS), metadata={"format": "pt"})
    for name, data in tok_files.items():
      (tmp / name).write_bytes(data)


def save_params_dir(
  directory: PathLike,
  cfg: BertConfig,
  params: Any,
  overwrite: bool = False,
  tokenizer: tokenizer_lib.Tokenizer | None = None,
  task: Mapping[str, Any] | None = None,
) -> None:
  """bert_jax's standalone format: bert_config.json + params.safetensors (dtypes kept), and
  the tokenizer (if given) in tokenizer/. A fine-tuned tree ({"bert", "head"}) needs its
  `task` (written as task.json); keys are then "bert/..." and "head/..."."""
  from safetensors.numpy import save_file

  params = _unbox_to_numpy(params)
  task = None if task is None else check_task(task, "task")
  _check_params_dir_tree(params, cfg, task, "params", "task (the task= argument)")
  cfg = dataclasses.replace(cfg, scan_layers=is_scanned(params))  # the stored layout
  flat = {k: np.ascontiguousarray(v) for k, v in flatten(params).items()}
  with _AtomicDir(directory, overwrite) as tmp:
    text = json.dumps(dataclasses.asdict(cfg), indent=2, sort_keys=True) + "\n"
    (tmp / PARAMS_CONFIG).write_text(text)
    save_file(flat, str(tmp / PARAMS_FILE), metadata={"format": "bert_jax"})
    if task is not None:
      (tmp / TASK_FILE).write_text(json.dumps(task, indent=2) + "\n")
    if tokenizer is not None:
      tokenizer.save(tmp / TOKENIZER_DIR)


def _check_params_dir_tree(
  params: Params, cfg: BertConfig, task: dict[str, Any] | None, source: str, task_path: str
) -> None:
  """A pretraining or BertModel tree without a task, or {"bert", "head"} with one."""
  if not has_head(params):
    if task is not None:
      raise ValueError(f"{task_path}: a {task['kind']} task, but {source} has no head")
    _check_tree(unstack_layers(params), cfg, is_pretraining(params), source)
    return
  if task is None:
    raise ValueError(f"{task_path}: missing; {source} has a 'head', which needs its task")
  if set(params) != {"bert", "head"}:
    raise ValueError(
      f"{source}: a fine-tuned tree has 'bert' and 'head' only, got {sorted(params)}"
    )
  _check_tree(unstack_layers(params["bert"]), cfg, False, source)
  check_head(params["head"], task, cfg.hidden_size, source)


def load_params_dir(
  directory: PathLike, scan_layers: bool | None = None
) -> tuple[BertConfig, Params]:
  """(cfg, params) from save_params_dir's format; scan_layers picks the returned layout.

  A fine-tuned dir gives {"bert", "head"} (its task: `read_task`). Fields this BertConfig no
  longer has (written by other versions) are ignored."""
  d = pathlib.Path(directory)
  cfg_path = d / PARAMS_CONFIG
  fields = _read_json(cfg_path)
  try:
    cfg = ckpt_lib.bert_config_from_meta({"model": fields})
  except (TypeError, ValueError) as e:
    raise ValueError(f"{cfg_path}: {e}") from None
  weights = d / PARAMS_FILE
  params = unflatten(_read_safetensors(weights))
  task = read_task(d)
  try:
    _check_params_dir_tree(params, cfg, task, str(weights), str(d / TASK_FILE))
  except (KeyError, IndexError, StopIteration) as e:
    raise ValueError(f"{weights}: malformed parameter tree ({e!r})") from None
  if scan_layers is not None:
    cfg = dataclasses.replace(cfg, scan_layers=scan_layers)
  return cfg, to_layout(params, cfg.scan_layers)


# ---------------------------------------------------------------------------------------------
# Tokenizers in HuggingFace's files.
# ---------------------------------------------------------------------------------------------

HF_VOCAB = "vocab.txt"
HF_TOKENIZER = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_SPECIAL_TOKENS = "special_tokens_map.json"
HF_SPM = "spm.model"  # a SentencePiece model, bert_jax's own name for it
_HF_SPECIAL_NAMES = {
  "unk_token": "[UNK]",
  "sep_token": "[SEP]",
  "pad_token": "[PAD]",
  "cls_token": "[CLS]",
  "mask_token": "[MASK]",
}


def _hf_wordpiece(tok: tokenizer_lib.WordPieceTokenizer):
  """BertTokenizerFast's tokenizer.json for our WordPiece (same ids as ours on BERT text)."""
  import tokenizers
  from tokenizers import decoders, models, normalizers, pre_tokenizers

  vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
  hf = tokenizers.Tokenizer(
    models.WordPiece(
      vocab={t: i for i, t in enumerate(vocab)},
      unk_token="[UNK]",
      continuing_subword_prefix="##",
      max_input_chars_per_word=tok.max_input_chars_per_word,
    )
  )
  hf.normalizer = normalizers.BertNormalizer(
    clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=tok.lowercase
  )
  hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  hf.decoder = decoders.WordPiece(prefix="##")
  return hf


def _hf_unigram(tok: tokenizer_lib.SentencePieceTokenizer):
  """A `tokenizers` Unigram equal to a SentencePiece unigram model: its pieces and scores,
  its precompiled normalizer, whitespace collapsed and stripped, "▁" word prefixes."""
  import tokenizers
  from sentencepiece import sentencepiece_model_pb2
  from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tok.model_proto())
  spec, norm = proto.trainer_spec, proto.normalizer_spec
  if spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    raise ValueError(
      "only a unigram SentencePiece model exports to HuggingFace (this one is "
      f"{sentencepiece_model_pb2.TrainerSpec.ModelType.Name(spec.model_type)}); "
      "convert the weights alone with --tokenizer=false"
    )
  pieces = [(p.piece, p.score) for p in proto.pieces]
  hf = tokenizers.Tokenizer(models.Unigram(pieces, tok.unk_id, spec.byte_fallback))
  steps = [normalizers.Precompiled(norm.precompiled_charsmap)] if norm.precompiled_charsmap else []
  if norm.remove_extra_whitespaces:
    steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
  hf.normalizer = normalizers.Sequence(steps)
  scheme = "always" if norm.add_dummy_prefix else "never"
  hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  hf.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  return hf


def hf_tokenizer_files(tok: tokenizer_lib.Tokenizer, cfg: BertConfig) -> dict[str, bytes]:
  """The tokenizer in HuggingFace's files: a `tokenizers` tokenizer.json (what
  AutoTokenizer loads), tokenizer_config.json and special_tokens_map.json; plus vocab.txt for
  WordPiece (BertTokenizerFast) or spm.model for a unigram SentencePiece model
  (PreTrainedTokenizerFast)."""
  import tokenizers
  from tokenizers import processors

  if tok.vocab_size != cfg.vocab_size:
    raise ValueError(
      f"the tokenizer has {tok.vocab_size} tokens but the weights' vocab_size is {cfg.vocab_size}"
    )
  config = {"model_max_length": cfg.max_position_embeddings, **_HF_SPECIAL_NAMES}
  if isinstance(tok, tokenizer_lib.WordPieceTokenizer):
    hf = _hf_wordpiece(tok)
    vocab = "".join(tok.id_to_token(i) + "\n" for i in range(tok.vocab_size))
    files = {HF_VOCAB: vocab.encode("utf-8")}
    config = {
      "tokenizer_class": "BertTokenizer",
      "do_lower_case": tok.lowercase,
      "strip_accents": None,
      "tokenize_chinese_chars": True,
      "clean_up_tokenization_spaces": False,
      **config,
    }
  elif isinstance(tok, tokenizer_lib.SentencePieceTokenizer):
    hf = _hf_unigram(tok)
    files = {HF_SPM: tok.model_proto()}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
  else:
    raise ValueError(f"a {tok.kind} tokenizer has no HuggingFace equivalent")
  cls, sep = ("[CLS]", tok.cls_id), ("[SEP]", tok.sep_id)
  hf.post_processor = processors.TemplateProcessing(
    single="[CLS]:0 $A:0 [SEP]:0",
    pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
    special_tokens=[cls, sep],
  )
  hf.add_special_tokens(
    [tokenizers.AddedToken(t, special=True) for t in _HF_SPECIAL_NAMES.values()]
  )
  dump = lambda obj: (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
  return {
    **files,
    HF_TOKENIZER: hf.to_str(pretty=True).encode("utf-8"),
    HF_TOKENIZER_CONFIG: dump(config),
    HF_SPECIAL_TOKENS: dump(_HF_SPECIAL_NAMES),
  }


def load_hf_tokenizer(directory: PathLike) -> tokenizer_lib.Tokenizer | None:
  """WordPiece from an HF (or Google) dir's vocab.txt (or, without one, the WordPiece vocab in
  tokenizer.json), cased or not as tokenizer_config.json's do_lower_case says (without one: as
  the vocab's letters say); SentencePiece from an exported spm.model; None when there is none."""
  d = pathlib.Path(directory)
  fast = (_read_json(d / HF_TOKENIZER).get("model") or {}) if (d / HF_TOKENIZER).is_file() else {}
  fast = fast if fast.get("type") == "WordPiece" else {}
  if not (d / HF_VOCAB).is_file() and not isinstance(fast.get("vocab"), dict):
    if (d / HF_SPM).is_file():  # what hf_tokenizer_files writes for SentencePiece
      return tokenizer_lib.SentencePieceTokenizer.from_file(d / HF_SPM)
    return None
  config = _read_json(d / HF_TOKENIZER_CONFIG) if (d / HF_TOKENIZER_CONFIG).is_file() else {}
  if (d / HF_VOCAB).is_file():
    vocab = tokenizer_lib.read_vocab(d / HF_VOCAB)
  else:
    by_id = sorted(fast["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
      raise ValueError(f"{d / HF_TOKENIZER}: WordPiece ids are not 0..{len(by_id) - 1}")
    vocab = [t for t, _ in by_id]
  # Without a tokenizer_config.json (Google's releases) the vocab says it: an uncased vocab
  # has no upper-case letters outside its [SPECIAL] tokens.
  cased_vocab = any(t != t.lower() for t in vocab if not t.startswith("["))
  lowercase = bool(config.get("do_lower_case", not cased_vocab))
  strip = config.get("strip_accents")
  if strip is not None and bool(strip) != lowercase:
    raise ValueError(
      f"{d / HF_TOKENIZER_CONFIG}: strip_accents={strip} with do_lower_case={lowercase} is not "
      "a BERT tokenizer setting"
    )
  if not config.get("tokenize_chinese_chars", True):
    raise ValueError(f"{d / HF_TOKENIZER_CONFIG}: tokenize_chinese_chars=false is not supported")
  options = {"lowercase": lowercase}
  if "max_input_chars_per_word" in fast:  # the fast tokenizer's word-length limit
    options["max_input_chars_per_word"] = int(fast["max_input_chars_per_word"])
  source = str(d / (HF_VOCAB if (d / HF_VOCAB).is_file() else HF_TOKENIZER))
  return tokenizer_lib.WordPieceTokenizer(vocab, source=source, **options)


# ---------------------------------------------------------------------------------------------
# The loader.
# ---------------------------------------------------------------------------------------------

FORMATS = ("workdir", "orbax", "tf", "bert_jax", "hf")
_LOOKED_FOR = (
  "checkpoints/<step>/ (bert_jax workdir), <step>/meta (orbax step), "
  f"{PARAMS_FILE} (bert_jax params dir), {TF_CKPT}.index (Google TF), "
  f"{HF_CONFIG} + {HF_WEIGHTS} or pytorch_model.bin (HuggingFace)"
)
_HF_WEIGHT_FILES = (
  "model.safetensors",
  "model.safetensors.index.json",
  "pytorch_model.bin",
  "pytorch_model.bin.index.json",
)


@dataclasses.dataclass
class Checkpoint:
  """What `load_checkpoint` found: `params` holds the MLM/NSP heads iff `has_heads`.

  A fine-tuned model (a params dir with task.json, or an HF BertFor{SequenceClassification,
  TokenClassification,QuestionAnswering,MultipleChoice}) has its encoder in `params` (the
  BertModel tree), its head params in `head` and its task.json dict in `task`."""

  config: BertConfig
  params: Any
  tokenizer: tokenizer_lib.Tokenizer | None
  format: str
  path: str
  step: int | None = None
  meta: dict = dataclasses.field(default_factory=dict)
  head: dict | None = None
  task: dict | None = None

  @property
  def has_heads(self) -> bool:
    return is_pretraining(self.params)


def _is_step_dir(p: pathlib.Path) -> bool:
  return (p / "meta").is_dir() and (p / "params").is_dir()


def detect_format(path: PathLike) -> str:
  """One of FORMATS for an existing checkpoint path, from the files it holds."""
  p = pathlib.Path(path)
  if pathlib.Path(f"{p}.index").is_file():  # a TF checkpoint prefix, e.g. .../bert_model.ckpt
    return "tf"
  if not p.exists():
    raise FileNotFoundError(f"{p}: no such file or directory")
  if p.is_dir() and _is_step_dir(p):
    return "orbax"
  if (p / "checkpoints").is_dir() or (p.is_dir() and any(map(_is_step_dir, p.iterdir()))):
    return "workdir"
  if (p / f"{TF_CKPT}.index").is_file():
    return "tf"
  if (p / PARAMS_FILE).is_file():
    return "bert_jax"
  if (p / HF_CONFIG).is_file() and any((p / f).is_file() for f in _HF_WEIGHT_FILES):
    return "hf"
  if (p / "feature_head.safetensors").is_file():  # bert_jax.tasks.features.HEAD_FILE
    raise ValueError(
      f"{p}: a feature-based head (a BiLSTM tagger over a frozen encoder's features) has no "
      "HuggingFace form; its encoder is the checkpoint named in its task.json"
    )
  raise FileNotFoundError(f"{p}: not a checkpoint (looked for {_LOOKED_FOR})")


def _orbax_tokenizer(meta: dict, directory: str) -> tokenizer_lib.Tokenizer | None:
  """The workdir's tokenizer/ (or its data dir's), checked against the stored fingerprint."""
  workdir = os.path.dirname(directory.rstrip("/"))  # <workdir>/checkpoints -> <workdir>
  candidates = [os.path.join(workdir, TOKENIZER_DIR)]
  if meta.get("data_dir"):
    candidates.append(os.path.join(meta["data_dir"], TOKENIZER_DIR))
  for c in candidates:
    if os.path.isdir(c):
      try:
        tok = tokenizer_lib.load_tokenizer(c)
      except (ValueError, OSError) as e:  # the workdir's tokenizer, not a checkpoint
        raise ckpt_lib.WorkdirError(f"the run's tokenizer does not load: {e}") from None
      want = meta.get("tokenizer", {}).get("fingerprint")
      if want and tok.fingerprint != want:
        raise ckpt_lib.WorkdirError(
          f"{c}: this tokenizer (fingerprint {tok.fingerprint[:12]}) is not the one the "
          f"checkpoints were trained with ({want[:12]}); they are fine: put that tokenizer back"
        )
      return tok
  return None


def read_config(path: PathLike, step: int | None = None) -> tuple[str, BertConfig]:
  """(format, BertConfig) of a checkpoint without reading its weights."""
  fmt = detect_format(path)
  p = pathlib.Path(path)
  if step is not None and fmt not in ("workdir", "orbax"):
    raise ValueError(f"{p}: step={step} given, but a {fmt} checkpoint has no steps")
  if fmt in ("workdir", "orbax"):
    meta, _, _ = ckpt_lib.read_meta(str(p), step)
    return fmt, ckpt_lib.bert_config_from_meta(meta)
  if fmt == "bert_jax":
    return fmt, ckpt_lib.bert_config_from_meta({"model": _read_json(p / PARAMS_CONFIG)})
  cfg_path = (p if p.is_dir() else p.parent) / (HF_CONFIG if fmt == "hf" else PARAMS_CONFIG)
  return fmt, config_from_hf(_read_json(cfg_path), str(cfg_path))


def check_architecture(cfg: BertConfig, want: BertConfig, source: str) -> None:
  """One line naming every shape field in which a checkpoint differs from `want`."""
  diffs = [
    f"{k}={getattr(cfg, k)} (checkpoint) vs {getattr(want, k)} (config)"
    for k in ckpt_lib.SHAPE_FIELDS
    if getattr(cfg, k) != getattr(want, k)
  ]
  if diffs:
    raise ValueError(f"checkpoint {source} is another architecture: {'; '.join(diffs)}")


def place(params: Params, target: Any) -> Any:
  """Host arrays -> jax Arrays with the target's dtypes and shardings (any mesh, any host)."""
  import jax

  def put(x, t):
    x = np.asarray(x).astype(t.dtype)
    if tuple(x.shape) != tuple(t.shape):
      raise ValueError(f"parameter has shape {x.shape}, the target {t.shape}")
    return jax.make_array_from_callback(x.shape, t.sharding, lambda idx: x[idx])

  return jax.tree.map(put, params, target)


def load_checkpoint(
  path: PathLike,
  step: int | None = None,
  *,
  scan_layers: bool | None = None,
  target: Any = None,
  like: BertConfig | None = None,
) -> Checkpoint:
  """Any supported checkpoint -> `Checkpoint(config, params, tokenizer, ...)`.

  step: a workdir's step (default the latest). scan_layers: the returned layout (None: the
  stored one). target: abstract params (ShapeDtypeStructs with shardings) of the caller's
  model: params come back as jax Arrays in its layout, dtypes and shardings (a
  BertForPreTraining target given a BertModel checkpoint gets {"bert": ...}, without heads; a
  BertModel target drops the heads; a fine-tuning target {"bert", "head"} gets the
  checkpoint's head too when its shapes equal the target's, else {"bert"} alone, so the
  caller's fresh head stays). like: a BertConfig the checkpoint's shapes must match (checked
  before any weights are read). Without a target, params are host numpy arrays.

  A fine-tuned checkpoint (params dir with task.json, HF BertFor{SequenceClassification,...})
  returns its encoder as the BertModel tree in `params`, and `head` and `task` besides.
  """
  p = pathlib.Path(os.path.abspath(os.fspath(path)))
  fmt, cfg = read_config(p, step)
  if like is not None:
    check_architecture(cfg, like, str(path))
  if target is not None:
    scan_layers = is_scanned(target)
  meta: dict = {}
  tok = None
  placed = False
  task = None
  if fmt in ("workdir", "orbax"):
    import jax

    meta, step, directory = ckpt_lib.read_meta(str(p), step)
    stored = dataclasses.replace(cfg, remat_policy="none")
    abstract = model_lib.abstract_params(stored)
    direct = target is not None and is_pretraining(target) and not has_head(target)
    if direct and scan_layers == cfg.scan_layers:
      params, _ = ckpt_lib.restore_params(str(p), target, step)  # straight onto the mesh
      placed = True
    else:
      params, _ = ckpt_lib.restore_params(str(p), ckpt_lib.single_device_target(abstract), step)
      params = jax.tree.map(np.asarray, params)
    tok = _orbax_tokenizer(meta, directory)
  elif fmt == "bert_jax":
    cfg, params = load_params_dir(p)
    task = read_task(p)
    if (p / TOKENIZER_DIR).is_dir():
      tok = tokenizer_lib.load_tokenizer(p / TOKENIZER_DIR)
  elif fmt == "hf":
    cfg, params = load_hf(p)
    task = task_from_hf_config(_read_json(p / HF_CONFIG), str(p / HF_CONFIG))
    tok = load_hf_tokenizer(p)
  else:
    cfg, params = load_tf(p)
    tok = load_hf_tokenizer(p if p.is_dir() else p.parent)
  if tok is not None and tok.vocab_size != cfg.vocab_size:
    raise ValueError(
      f"{path}: the tokenizer has {tok.vocab_size} tokens but the weights' vocab_size is "
      f"{cfg.vocab_size}"
    )
  head = None
  if has_head(params):
    head, params = params["head"], params["bert"]
  if scan_layers is not None:
    cfg = dataclasses.replace(cfg, scan_layers=scan_layers)
  if target is not None and not placed:
    params = to_layout(params, scan_layers)
    if has_head(target):
      body = params["bert"] if is_pretraining(params) else params
      params = {"bert": place(body, target["bert"])}
      if head is not None and _shapes(head) == _shapes(target["head"]):
        params["head"] = place(head, target["head"])
    elif is_pretraining(target) and not is_pretraining(params):
      params = {"bert": place(params, target["bert"])}
    else:
      if not is_pretraining(target) and is_pretraining(params):
        params = params["bert"]
      params = place(params, target)
  elif scan_layers is not None:
    params = to_layout(params, scan_layers)
  return Checkpoint(cfg, params, tok, fmt, str(p), step, meta, head, task)


def _shapes(tree: Params) -> dict[str, tuple[int, ...]]:
  return {k: tuple(np.shape(x)) for k, x in flatten(tree).items()}


def convert(
  src: PathLike,
  dst: PathLike,
  dst_format: str = "auto",
  scan_layers: bool | None = None,
  overwrite: bool = False,
  step: int | None = None,
  tokenizer: bool = True,
) -> str:
  """src (any format) -> dst; 'auto' exports bert_jax's formats to hf and imports the others
  into a params dir. A fine-tuned model keeps its head and task both ways (HF's
  BertFor{SequenceClassification,TokenClassification,QuestionAnswering,MultipleChoice} <->
  a params dir with task.json). Returns the format written."""
  src_format = detect_format(src)
  if dst_format == "auto":
    dst_format = "hf" if src_format in ("workdir", "orbax", "bert_jax") else "bert_jax"
  if dst_format not in ("hf", "bert_jax"):
    raise ValueError(f"--dst_format must be auto, hf or bert_jax, not {dst_format!r}")
  ck = load_checkpoint(src, step, scan_layers=scan_layers)
  tok = ck.tokenizer if tokenizer else None
  save = save_hf if dst_format == "hf" else save_params_dir
  params = ck.params if ck.head is None else {"bert": ck.params, "head": ck.head}
  save(dst, ck.config, params, overwrite, tok, task=ck.task)
  return dst_format


def load(path: PathLike, scan_layers: bool | None = None) -> tuple[BertConfig, Params]:
  """(cfg, host params) of any supported checkpoint; scan_layers=None keeps the stored layout."""
  ck = load_checkpoint(path, scan_layers=scan_layers)
  return ck.config, ck.params
