"""Weights in files: HuggingFace and Google TF checkpoints read, HuggingFace and params dirs
written and read.

  hf        config.json + model.safetensors, pytorch_model.bin (read with
            torch.load(weights_only=True)), or a sharded `*.index.json`; BertModel,
            BertForPreTraining or a fine-tuned head class (`hf_heads`)
  tf        Google's release: bert_config.json + bert_model.ckpt.index (needs the `tf` extra)
  bert_jax  a params dir: bert_config.json (BertConfig fields) + params.safetensors ("/"-joined
            param paths, dtypes kept) + tokenizer/; a fine-tuned one adds task.json

`save_hf` writes what transformers' `from_pretrained` loads with no missing or unexpected keys,
and the tokenizer in HuggingFace's own files (`tokenizer_files`). Outputs are written to a temp
dir and renamed at the end, so a failed conversion leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bert_jax import params_tree
from bert_jax.interop import hf_heads, hf_names
from bert_jax.model_config import BertConfig
from bert_jax.params_tree import Params
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.runtime.files import AtomicDir, PathLike, read_json
from bert_jax.tokenizers import files as tokenizer_files
from bert_jax.tokenizers import tokenizer as tokenizer_lib
from bert_jax.trees import flatten, unflatten

HF_WEIGHTS = "model.safetensors"
HF_CONFIG = "config.json"
PARAMS_FILE = "params.safetensors"
PARAMS_CONFIG = "bert_config.json"  # also the name Google's TF release uses for its config
TF_CKPT = "bert_model.ckpt"
TOKENIZER_DIR = tokenizer_lib.TOKENIZER_DIR  # bert_jax's own tokenizer in workdirs, params dirs
TASK_FILE = hf_heads.TASK_FILE  # a fine-tuned params dir's task (hf_heads.check_task)


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
  data = read_json(index)
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
  `hf_heads.task_from_hf_config`."""
  d = pathlib.Path(directory)
  if not d.is_dir():
    raise FileNotFoundError(f"{d}: no such directory")
  cfg_path = d / HF_CONFIG
  hf = read_json(cfg_path)
  cfg = hf_names.config_from_hf(hf, str(cfg_path), **overrides)
  task = hf_heads.task_from_hf_config(hf, str(cfg_path))
  sd, path = read_hf_state_dict(d)
  if task is not None and pretraining is not True:
    params = hf_heads.hf_state_dict_to_params(sd, cfg, task, str(path))
    return cfg, (params if pretraining is None else params["bert"])
  return cfg, hf_names.hf_state_dict_to_params(sd, cfg, pretraining, str(path))


def load_tf(path: PathLike, **overrides: Any) -> tuple[BertConfig, Params]:
  """(cfg, params) from Google's release dir (bert_config.json + bert_model.ckpt.*)."""
  p = pathlib.Path(path)
  directory, prefix = (p, p / TF_CKPT) if p.is_dir() else (p.parent, p)
  if not pathlib.Path(f"{prefix}.index").is_file():
    raise FileNotFoundError(f"{prefix}.index: no such file")
  cfg_path = directory / PARAMS_CONFIG
  cfg = hf_names.config_from_hf(read_json(cfg_path), str(cfg_path), **overrides)
  try:
    import tensorflow as tf
  except ImportError:
    raise ImportError(
      f"{prefix}: reading a TensorFlow checkpoint needs tensorflow (pip install 'bert_jax[tf]')"
    ) from None
  reader = tf.train.load_checkpoint(str(prefix))
  variables = {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(str(prefix))}
  sd = hf_names.tf_variables_to_hf_state_dict(variables)
  return cfg, hf_names.hf_state_dict_to_params(sd, cfg, None, str(prefix))


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

  sd = _hf_state_dict(params, cfg, task)  # validates before anything is written
  hf_cfg = hf_names.config_to_hf(cfg, pretraining=any(k.startswith("cls.") for k in sd))
  if task is not None:
    hf_cfg.update(hf_heads.task_to_hf_config(hf_heads.check_task(task, "task")))
  tok_files = {} if tokenizer is None else tokenizer_files.hf_tokenizer_files(tokenizer, cfg)
  with AtomicDir(directory, overwrite) as tmp:
    (tmp / HF_CONFIG).write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
    save_file(sd, str(tmp / HF_WEIGHTS), metadata={"format": "pt"})
    for name, data in tok_files.items():
      (tmp / name).write_bytes(data)


def _hf_state_dict(
  params: Any, cfg: BertConfig, task: Mapping[str, Any] | None
) -> dict[str, np.ndarray]:
  """The tensors of a pretraining or BertModel tree, or of a fine-tuned tree with its task."""
  if params_tree.has_head(params):
    if task is None:
      raise ValueError("params have a 'head' but no task was given (its kind picks the HF class)")
    return hf_heads.params_to_hf_state_dict(params, cfg, task)
  if task is not None:
    raise ValueError(f"a {task.get('kind')} task was given but the params have no 'head'")
  return hf_names.params_to_hf_state_dict(params, cfg)


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

  params = params_tree.unbox_to_numpy(params)
  task = None if task is None else hf_heads.check_task(task, "task")
  _check_params_dir_tree(params, cfg, task, "params", "task (the task= argument)")
  cfg = dataclasses.replace(cfg, scan_layers=params_tree.is_scanned(params))  # the stored layout
  flat = {k: np.ascontiguousarray(v) for k, v in flatten(params).items()}
  with AtomicDir(directory, overwrite) as tmp:
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
  if not params_tree.has_head(params):
    if task is not None:
      raise ValueError(f"{task_path}: a {task['kind']} task, but {source} has no head")
    params_tree.check_tree(
      params_tree.unstack_layers(params), cfg, params_tree.is_pretraining(params), source
    )
    return
  if task is None:
    raise ValueError(f"{task_path}: missing; {source} has a 'head', which needs its task")
  if set(params) != {"bert", "head"}:
    raise ValueError(
      f"{source}: a fine-tuned tree has 'bert' and 'head' only, got {sorted(params)}"
    )
  params_tree.check_tree(params_tree.unstack_layers(params["bert"]), cfg, False, source)
  hf_heads.check_head(params["head"], task, cfg.hidden_size, source)


def load_params_dir(
  directory: PathLike, scan_layers: bool | None = None
) -> tuple[BertConfig, Params]:
  """(cfg, params) from save_params_dir's format; scan_layers picks the returned layout.

  A fine-tuned dir gives {"bert", "head"} (its task: `read_task`). Fields this BertConfig no
  longer has (written by other versions) are ignored."""
  d = pathlib.Path(directory)
  cfg_path = d / PARAMS_CONFIG
  fields = read_json(cfg_path)
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
  return cfg, params_tree.to_layout(params, cfg.scan_layers)


def read_task(directory: PathLike) -> dict[str, Any] | None:
  """The checked task.json of a params dir, or None when it has none."""
  path = pathlib.Path(directory) / TASK_FILE
  return hf_heads.check_task(read_json(path), str(path)) if path.is_file() else None
