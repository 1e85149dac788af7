"""One loader for every checkpoint format, and `convert` between them.

`load_checkpoint(path, step=None, ...)` is behind `bert_jax.load`, `config.init_from` and
`python -m bert_jax.convert --src`. The format is read from the files, never from names:

  workdir   checkpoints/<step>/ written by training (latest step, or `step=`), tokenizer/
  orbax     one step directory of a workdir: <step>/{params, meta, ...}
  tf        Google's release: bert_config.json + bert_model.ckpt.index (needs the `tf` extra)
  bert_jax  bert_config.json (BertConfig fields) + params.safetensors ("/"-joined param paths)
  hf        config.json + model.safetensors, pytorch_model.bin (read with
            torch.load(weights_only=True)), or a sharded `*.index.json`; BertModel or
            BertForPreTraining weights, with or without the "bert." prefix.
Fine-tuned models (a params dir with task.json, or one of HF's head classes: `hf_heads`) come
back as their encoder in `params` with the head and task beside it; export and import keep
both. A tokenizer found beside the weights comes along (bert_jax's tokenizer/ directory;
HuggingFace's / Google's vocab.txt with tokenizer_config.json's do_lower_case; an exported
spm.model); its vocab size must equal the weights'.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import numpy as np

from bert_jax import model as model_lib
from bert_jax import params_tree
from bert_jax.interop import hf_heads, hf_io, hf_names
from bert_jax.interop.hf_io import HF_CONFIG, HF_WEIGHTS, PARAMS_CONFIG, PARAMS_FILE, TF_CKPT
from bert_jax.model_config import BertConfig
from bert_jax.params_tree import Params
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.runtime.files import PathLike, read_json
from bert_jax.tokenizers import files as tokenizer_files
from bert_jax.tokenizers import tokenizer as tokenizer_lib

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
    return params_tree.is_pretraining(self.params)


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
  candidates = [os.path.join(workdir, hf_io.TOKENIZER_DIR)]
  if meta.get("data_dir"):
    candidates.append(os.path.join(meta["data_dir"], hf_io.TOKENIZER_DIR))
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


def _newest(path: PathLike, step: int | None, fmt: str, load):
  """`load(step)`; for a workdir without `step`, that of its newest step that loads, each one
  that does not (empty, truncated, corrupt) named in one warning (`checkpoints.load_newest`,
  what the trainer's resume does read-only): every reader of a workdir falls back alike."""
  if fmt == "workdir" and step is None:
    return ckpt_lib.load_newest(path, load)
  return load(step)


def read_config(path: PathLike, step: int | None = None) -> tuple[str, BertConfig]:
  """(format, BertConfig) of a checkpoint without reading its weights (a workdir's newest step
  that has them, or `step`)."""
  fmt = detect_format(path)
  if fmt == "workdir" and step is None:
    return _newest(path, step, fmt, lambda s: read_config(path, s))
  p = pathlib.Path(path)
  if step is not None and fmt not in ("workdir", "orbax"):
    raise ValueError(f"{p}: step={step} given, but a {fmt} checkpoint has no steps")
  if fmt in ("workdir", "orbax"):
    meta, _, _ = ckpt_lib.read_meta(str(p), step)
    return fmt, ckpt_lib.bert_config_from_meta(meta)
  if fmt == "bert_jax":
    return fmt, ckpt_lib.bert_config_from_meta({"model": read_json(p / PARAMS_CONFIG)})
  cfg_path = (p if p.is_dir() else p.parent) / (HF_CONFIG if fmt == "hf" else PARAMS_CONFIG)
  return fmt, hf_names.config_from_hf(read_json(cfg_path), str(cfg_path))


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
  returns its encoder as the BertModel tree in `params`, and `head` and `task` besides. A
  workdir's newest step that does not load is named in one warning and the one before is
  tried, as the trainer's resume does.
  """
  p = pathlib.Path(os.path.abspath(os.fspath(path)))
  if step is None and detect_format(p) == "workdir":
    return _newest(
      p,
      step,
      "workdir",
      lambda s: load_checkpoint(p, s, scan_layers=scan_layers, target=target, like=like),
    )
  fmt, cfg = read_config(p, step)
  if like is not None:
    try:
      ckpt_lib.check_architecture(cfg, like, str(path))
    except ValueError as e:  # every step of a workdir is the same architecture: no fallback
      raise (ckpt_lib.WorkdirError if fmt in ("workdir", "orbax") else ValueError)(e) from None
  if target is not None:
    scan_layers = params_tree.is_scanned(target)
  meta: dict = {}
  tok = None
  placed = False
  task = None
  if fmt in ("workdir", "orbax"):
    import jax

    meta, step, directory = ckpt_lib.read_meta(str(p), step)
    stored = dataclasses.replace(cfg, remat_policy="none")
    abstract = model_lib.abstract_params(stored)
    direct = (
      target is not None and params_tree.is_pretraining(target) and not params_tree.has_head(target)
    )
    if direct and scan_layers == cfg.scan_layers:
      params, _ = ckpt_lib.restore_params(str(p), target, step)  # straight onto the mesh
      placed = True
    else:
      params, _ = ckpt_lib.restore_params(str(p), ckpt_lib.single_device_target(abstract), step)
      params = jax.tree.map(np.asarray, params)
    tok = _orbax_tokenizer(meta, directory)
  elif fmt == "bert_jax":
    cfg, params = hf_io.load_params_dir(p)
    task = hf_io.read_task(p)
    if (p / hf_io.TOKENIZER_DIR).is_dir():
      tok = tokenizer_lib.load_tokenizer(p / hf_io.TOKENIZER_DIR)
  elif fmt == "hf":
    cfg, params = hf_io.load_hf(p)
    task = hf_heads.task_from_hf_config(read_json(p / HF_CONFIG), str(p / HF_CONFIG))
    tok = tokenizer_files.load_hf_tokenizer(p)
  else:
    cfg, params = hf_io.load_tf(p)
    tok = tokenizer_files.load_hf_tokenizer(p if p.is_dir() else p.parent)
  if tok is not None and tok.vocab_size != cfg.vocab_size:
    raise ValueError(
      f"{path}: the tokenizer has {tok.vocab_size} tokens but the weights' vocab_size is "
      f"{cfg.vocab_size}"
    )
  head = None
  if params_tree.has_head(params):
    head, params = params["head"], params["bert"]
  if scan_layers is not None:
    cfg = dataclasses.replace(cfg, scan_layers=scan_layers)
  if target is not None and not placed:
    params = params_tree.to_layout(params, scan_layers)
    if params_tree.has_head(target):
      body = params["bert"] if params_tree.is_pretraining(params) else params
      params = {"bert": params_tree.place(body, target["bert"])}
      if head is not None and params_tree.shapes(head) == params_tree.shapes(target["head"]):
        params["head"] = params_tree.place(head, target["head"])
    elif params_tree.is_pretraining(target) and not params_tree.is_pretraining(params):
      params = {"bert": params_tree.place(params, target["bert"])}
    else:
      if not params_tree.is_pretraining(target) and params_tree.is_pretraining(params):
        params = params["bert"]
      params = params_tree.place(params, target)
  elif scan_layers is not None:
    params = params_tree.to_layout(params, scan_layers)
  return Checkpoint(cfg, params, tok, fmt, str(p), step, meta, head, task)


def check_destination(src: PathLike, dst: PathLike) -> None:
  """One line, even with --overwrite, for a --dst that would replace (or sit among) a run's
  live files: a training workdir, a checkpoint step, anything inside a `checkpoints/`
  directory (the trainer would take it for its newest step), the source itself or a directory
  holding it, or one holding a workdir lock."""
  d = pathlib.Path(os.path.abspath(os.fspath(dst)))
  s = pathlib.Path(os.path.abspath(os.fspath(src)))
  if d == s or d in s.parents:
    raise ValueError(f"--dst={dst} holds --src={src}: write the export elsewhere")
  for parent in (d, *d.parents):
    if parent.name == "checkpoints" and parent.is_dir():
      raise ValueError(
        f"--dst={dst} is inside {parent}, a training run's checkpoints: write the export "
        "elsewhere (the trainer would take it for a step)"
      )
  if not d.is_dir():
    return
  try:
    fmt = detect_format(d)
  except (FileNotFoundError, ValueError):
    fmt = None
  if fmt in ("workdir", "orbax") or (d / "bert_jax.lock").exists():
    what = "a checkpoint step" if fmt == "orbax" else "a training workdir"
    raise ValueError(f"--dst={dst} is {what}: refusing to replace it; write the export elsewhere")


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
  check_destination(src, dst)
  if dst_format == "auto":
    dst_format = "hf" if src_format in ("workdir", "orbax", "bert_jax") else "bert_jax"
  if dst_format not in ("hf", "bert_jax"):
    raise ValueError(f"--dst_format must be auto, hf or bert_jax, not {dst_format!r}")
  ck = load_checkpoint(src, step, scan_layers=scan_layers)
  tok = ck.tokenizer if tokenizer else None
  save = hf_io.save_hf if dst_format == "hf" else hf_io.save_params_dir
  params = ck.params if ck.head is None else {"bert": ck.params, "head": ck.head}
  save(dst, ck.config, params, overwrite, tok, task=ck.task)
  return dst_format


def load(path: PathLike, scan_layers: bool | None = None) -> tuple[BertConfig, Params]:
  """(cfg, host params) of any supported checkpoint; scan_layers=None keeps the stored layout."""
  ck = load_checkpoint(path, scan_layers=scan_layers)
  return ck.config, ck.params
