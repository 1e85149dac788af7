"""What a fine-tuning run reads before it trains: the mesh, the model config, the init
checkpoint's weights and tokenizer, the encoded task data, and all of it by content
(`Prepared.inputs`: what a rerun must find unchanged to resume)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import config_schema, loop
from bert_jax import sharding as sh
from bert_jax import tasks as tasks_lib
from bert_jax.finetune import data as data_lib
from bert_jax.interop import hf_io, loader
from bert_jax.model_config import BertConfig
from bert_jax.tasks import features as features_lib
from bert_jax.tokenizers import tokenizer as tokenizer_lib

# BertConfig fields a fine-tuning config may set on top of the checkpoint's architecture.
RUN_FIELDS = (
  "hidden_dropout_prob",
  "attention_dropout_prob",
  "dtype",
  "param_dtype",
  "kernels",
  "dropout_rng",
  "attention_impl",
  "scan_layers",
  "remat_policy",
)


@dataclasses.dataclass
class Prepared:
  """Everything the seeds of a point share, read once."""

  mesh: Any
  rules: Any
  cfg: BertConfig
  tokenizer: Any
  init_params: Any  # the checkpoint's encoder (host arrays), None for a random init
  task: tasks_lib.Task
  data: data_lib.Splits
  head: Any  # TaskHead, or features.FeatureHead: the model, extra row inputs, best/'s format
  counts: dict[str, int]  # examples per split
  truncated: dict[str, int]  # examples per split that lost tokens to max_seq_length
  offsets: dict[str, Any]  # span QA's answer-offset check per split
  inputs: dict[str, Any]  # fingerprint_inputs: the task files, init and tokenizer by content


def model_config(config: ml_collections.ConfigDict) -> tuple[BertConfig, Any]:
  """(BertConfig, tokenizer or None): the checkpoint's architecture (or config.model's for a
  random init, `config.init=""`) with the run fields of config.model on top."""
  if not config.init:
    return random_init(config)
  _, stored = loader.read_config(config.init)
  return dataclasses.replace(stored, **run_fields(config)), None


def run_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return {k: config.model[k] for k in RUN_FIELDS if k in config.model}


def random_init(config: ml_collections.ConfigDict) -> tuple[BertConfig, Any]:
  """(config.model's BertConfig, the tokenizer of config.data.vocab or the bundled vocab): a
  model without pretraining."""
  fields = {k: v for k, v in config.model.to_dict().items() if k != "causal"}
  # A vocab.txt, or a tokenizer directory (a pretraining run's <workdir>/tokenizer).
  vocab = config.data.vocab or tokenizer_lib.default_vocab_path()
  return BertConfig(**fields), tokenizer_lib.load_tokenizer(vocab)


def check_size_overrides(config: ml_collections.ConfigDict, overridden: Iterable[str]) -> None:
  """A ConfigError (exit 2) for `--config.model.FIELD` flags that a checkpoint's architecture
  would silently replace (`overridden`: the config keys set on the command line): only
  RUN_FIELDS apply on top of `config.init`, and a size field equal to the checkpoint's is no
  contradiction."""
  keys = [k.split(".", 1)[1] for k in overridden if k.startswith("model.")]
  keys = [k for k in keys if k not in RUN_FIELDS and k in config.model]
  if not config.init or not keys:
    return
  _, stored = loader.read_config(config.init)
  wrong = [k for k in keys if getattr(stored, k, None) != config.model[k]]
  if wrong:
    flags = ", ".join(f"--config.model.{k}={config.model[k]}" for k in wrong)
    theirs = ", ".join(f"{k}={getattr(stored, k, None)}" for k in wrong)
    raise config_schema.ConfigError(
      f"{flags}: config.init={config.init} is a model with {theirs}, and fine-tuning runs the "
      f"checkpoint's architecture: drop the flag (on top of a checkpoint only "
      f"{', '.join('model.' + k for k in RUN_FIELDS)} apply)"
    )


def make_mesh(config: ml_collections.ConfigDict) -> tuple[Any, Any]:
  """(mesh, logical rules) of config.mesh, with the batch sizes checked against the devices (a
  ConfigError: exit 2, before the workdir is made); the fields alone are
  finetune.schema.check_finetuning's."""
  mesh = sh.make_mesh(config.mesh.shape)
  rules = sh.rules_from_config(config.mesh.rules)
  dp = sh.data_parallel_size(mesh)
  for name, b in (
    ("data.batch_size", config.data.batch_size),
    ("data.eval_batch_size", config.data.eval_batch_size),
  ):
    if b % dp:
      raise config_schema.ConfigError(
        f"config.{name}={b} is not divisible by the data-parallel size {dp} "
        f"(mesh data x fsdp = {dict(mesh.shape)})"
      )
    if b % jax.process_count():
      raise config_schema.ConfigError(
        f"config.{name}={b} is not divisible by {jax.process_count()} hosts"
      )
  if (config.data.batch_size // config.opt.grad_accum_steps) % dp:
    raise config_schema.ConfigError(
      "the micro-batch (batch_size / grad_accum_steps) is not divisible by the data-parallel size"
    )
  return mesh, rules


@dataclasses.dataclass(frozen=True)
class TaskHead:
  """Ordinary fine-tuning's head: the encoder trains under the task kind's head (with Table
  5's "+ BiLSTM" when `bilstm`); best/ is a params dir with task.json, which `convert` exports
  to the matching HuggingFace class. (The feature-based mode's is `features.FeatureHead`.)"""

  bilstm: bool = False

  def add_inputs(self, cfg, bert_params, data, pad_id, mesh, rules) -> str:
    return ""  # the rows are the encoder's inputs as they are

  def make_model(self, cfg: BertConfig, task: tasks_lib.Task) -> Any:
    return task.model(cfg, self.bilstm)

  def save(self, path: str, cfg, params, tokenizer, info: dict[str, Any]) -> None:
    hf_io.save_params_dir(path, cfg, params, overwrite=True, tokenizer=tokenizer, task=info)


def prepare(config: ml_collections.ConfigDict) -> Prepared:
  """The mesh, the model config, the checkpoint's weights and tokenizer, the encoded splits."""
  run = run_fields(config)
  mesh, rules = make_mesh(config)
  data_lib.check_task_files(config.task)
  init_params = init = None
  if config.init:
    # Host arrays in the run's layer layout, placed on the mesh per seed.
    ck = loader.load_checkpoint(config.init, scan_layers=run.get("scan_layers"))
    cfg, tokenizer = dataclasses.replace(ck.config, **run), ck.tokenizer
    if tokenizer is None:
      if not config.data.vocab:
        raise ValueError(f"config.init={config.init} has no tokenizer: set config.data.vocab")
      tokenizer = tokenizer_lib.WordPieceTokenizer.from_file(config.data.vocab)
    init_params = ck.params["bert"] if "bert" in ck.params else ck.params
    init = {"path": config.init, "format": ck.format, "step": ck.step}
    init["params_sha256"] = params_sha256(ck.params)
  else:
    cfg, tokenizer = random_init(config)
  if tokenizer.vocab_size != cfg.vocab_size:
    raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model {cfg.vocab_size}")
  if config.data.max_seq_length > cfg.max_position_embeddings:
    raise ValueError(
      f"config.data.max_seq_length={config.data.max_seq_length} exceeds the model's "
      f"max_position_embeddings={cfg.max_position_embeddings}"
    )
  task, data = data_lib.load_task_data(config, tokenizer)
  if data["train"] is None or not data["train"].rows:
    raise ValueError(f"task {task.name}: the train split is empty")
  if data["dev"] is None:
    raise ValueError(f"task {task.name}: no dev split (config.task.dev) to select on")
  offsets = data_lib.offsets(data)
  if offsets:
    loop.console(f"offset check: {json.dumps(offsets)}")
  if features_lib.enabled(config):
    features_lib.check(config, task.kind)
    head = features_lib.FeatureHead(config)
  else:
    head = TaskHead(config.head.bilstm)
  added = head.add_inputs(cfg, init_params, data, tokenizer.pad_id, mesh, rules)
  if added:
    loop.console(added)
  return Prepared(
    mesh=mesh,
    rules=rules,
    cfg=cfg,
    tokenizer=tokenizer,
    init_params=init_params,
    task=task,
    data=data,
    head=head,
    counts={s: (len(d.examples) if d else 0) for s, d in data.items()},
    truncated={s: (d.encoded.n_truncated if d else 0) for s, d in data.items()},
    offsets=offsets,
    inputs={"task": data_lib.fingerprints(data), "init": init, "tokenizer": tokenizer.fingerprint},
  )


def params_sha256(params: Any) -> str:
  """sha256 over every weight's name, dtype, shape and bytes (in the run's layer layout,
  model.scan_layers)."""
  h = hashlib.sha256()
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  for path, leaf in sorted((jax.tree_util.keystr(p), x) for p, x in leaves):
    x = np.ascontiguousarray(leaf)
    h.update(f"{path} {x.dtype} {x.shape}\n".encode())
    h.update(memoryview(x).cast("B"))
  return h.hexdigest()
