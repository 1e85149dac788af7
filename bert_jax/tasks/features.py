"""The feature-based mode (Devlin et al. 2019, Section 5.3 and Table 7): BERT frozen, ELMo-style.

The encoder never trains: before the first step, one jitted BertModel forward (length-bucketed
batches, `output_hidden_states=True`) computes every row's chosen hidden states once, kept on
the host as a row field "features" [L_row, K, D] (`config.features.dtype`). The train state
holds the tagger's params only (no encoder params, no optimizer state for them):

  features [B, L, K, D] -> combine (concat -> [B, L, K*D], or the ELMo scalar mix
  gamma * sum_k softmax(w)_k h_k -> [B, L, D]) -> lstm_layers x BiLSTM (dropout before each)
  -> dropout -> classifier per token [B, L, N]

Hidden-state indices count BertModel's `hidden_states`: 0 is the embeddings output, 1..N the
encoder layers, negative ones count from the last (-1 the last layer). Table 7's rows
(`configs/finetune.py:wnut16_ner,features=ROW`):

  embeddings      (0,)              concat
  second_to_last  (-2,)             concat
  last            (-1,)             concat
  sum_last4       (-4, -3, -2, -1)  weighted sum
  concat_last4    (-4, -3, -2, -1)  concat
  sum_all         1..N (all_layers) weighted sum

The best dev point is saved as a "feature head" dir (not a params dir: it holds no encoder):
feature_head.safetensors ("head/..." keys), task.json (with "features" and "encoder", the
frozen checkpoint), encoder_config.json and tokenizer/. HuggingFace has no class for it.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax import Array

from bert_jax import model as model_lib
from bert_jax import model_config, params_tree, trees
from bert_jax import sharding as sh
from bert_jax.runtime import files
from bert_jax.tasks import batches, kinds
from bert_jax.tokenizers.tokenizer import TOKENIZER_DIR

ROWS: dict[str, dict[str, Any]] = {
  "embeddings": dict(layers=(0,), all_layers=False, combine="concat"),
  "second_to_last": dict(layers=(-2,), all_layers=False, combine="concat"),
  "last": dict(layers=(-1,), all_layers=False, combine="concat"),
  "sum_last4": dict(layers=(-4, -3, -2, -1), all_layers=False, combine="weighted_sum"),
  "concat_last4": dict(layers=(-4, -3, -2, -1), all_layers=False, combine="concat"),
  "sum_all": dict(layers=(), all_layers=True, combine="weighted_sum"),
}
COMBINES = ("concat", "weighted_sum")
DTYPES = ("float32", "bfloat16", "float16")
HEAD_FILE = "feature_head.safetensors"
ENCODER_CONFIG = "encoder_config.json"


def feature_config(row: str = "") -> ml_collections.ConfigDict:
  """config.features: empty `layers` and all_layers=False is ordinary fine-tuning; `row`
  (a Table-7 row name) fills layers/all_layers/combine."""
  f = ml_collections.ConfigDict()
  f.row = ""
  f.layers = ()  # hidden-state indices: 0 embeddings, 1..N layers, -1 the last
  f.all_layers = False  # every encoder layer 1..N (Table 7's "all 12 layers")
  f.combine = "concat"  # or "weighted_sum" (ELMo's scalar mix: softmax weights, gamma)
  f.lstm_size = 0  # units per direction; 0: hidden_size // 2 (the BiLSTM outputs hidden_size)
  f.lstm_layers = 2
  f.dtype = "float32"  # host storage of the features: float32 | bfloat16 | float16
  if row:
    if row not in ROWS:
      raise ValueError(f"unknown Table-7 row features={row!r}; known: {', '.join(ROWS)}")
    f.row = row
    f.update(ROWS[row])
  return f


def enabled(config: ml_collections.ConfigDict) -> bool:
  f = config.get("features")
  return f is not None and bool(f.layers or f.all_layers)


def resolve_layers(f: ml_collections.ConfigDict, num_layers: int) -> tuple[int, ...]:
  """config.features' layers as indices 0..num_layers into BertModel's hidden_states."""
  if f.all_layers:
    return tuple(range(1, num_layers + 1))
  out = []
  for i in f.layers:
    if not -(num_layers + 1) <= i <= num_layers:
      raise ValueError(
        f"config.features.layers: {i} is out of range for a {num_layers}-layer model "
        f"(0..{num_layers}, or -{num_layers + 1}..-1)"
      )
    out.append(i % (num_layers + 1))
  return tuple(out)


def check(config: ml_collections.ConfigDict, kind: str) -> None:
  f = config.features
  if kind != "tagging":
    raise ValueError(f"config.features: the feature-based mode tags tokens; task kind is {kind}")
  if f.combine not in COMBINES:
    raise ValueError(f"config.features.combine must be one of {COMBINES}, not {f.combine!r}")
  if f.dtype not in DTYPES:
    raise ValueError(f"config.features.dtype must be one of {DTYPES}, not {f.dtype!r}")
  if f.lstm_layers < 1:
    raise ValueError(f"config.features.lstm_layers must be >= 1, not {f.lstm_layers}")
  if config.head.bilstm:
    raise ValueError("config.head.bilstm and config.features both add a BiLSTM: set one")


# ----------------------------------------------------------------------------- the tagger


class ScalarMix(nn.Module):
  """ELMo's learned layer combination: gamma * sum_k softmax(w)_k h_k (w = 0, gamma = 1 at
  init: the plain average)."""

  @nn.compact
  def __call__(self, h_BLKD: Array) -> Array:
    w_K = self.param("weights", nn.initializers.zeros, (h_BLKD.shape[-2],), jnp.float32)
    gamma = self.param("gamma", nn.initializers.ones, (), jnp.float32)
    return gamma * jnp.einsum("blkd,k->bld", h_BLKD, jax.nn.softmax(w_K))


class BiLSTM(nn.Module):
  """One bidirectional LSTM layer over the first `lengths_B` positions of each row."""

  size: int

  @nn.compact
  def __call__(self, x_BLE: Array, lengths_B: Array) -> Array:
    return nn.Bidirectional(
      nn.RNN(nn.OptimizedLSTMCell(self.size, name="lstm_forward")),
      nn.RNN(nn.OptimizedLSTMCell(self.size, name="lstm_backward")),
    )(x_BLE, seq_lengths=lengths_B)


class FeatureTagger(nn.Module):
  """Frozen features [B, L, K, D] + input_mask [B, L] -> float32 tag logits [B, L, N]."""

  num_outputs: int
  combine: str = "concat"
  lstm_size: int = 384
  lstm_layers: int = 2
  dropout_rate: float = 0.1

  # The batch fields the engine feeds (instead of input_ids, segment_ids, input_mask).
  inputs = ("features", "input_mask")

  @nn.compact
  def __call__(self, features_BLKD: Array, input_mask_BL: Array, *, deterministic: bool = True):
    h_BLKD = features_BLKD.astype(jnp.float32)
    b, length, k, d = h_BLKD.shape
    if self.combine == "weighted_sum":
      x_BLE = ScalarMix(name="scalar_mix")(h_BLKD)
    else:
      x_BLE = h_BLKD.reshape(b, length, k * d)
    lengths_B = jnp.sum(input_mask_BL, -1).astype(jnp.int32)
    for i in range(self.lstm_layers):
      x_BLE = nn.Dropout(self.dropout_rate)(x_BLE, deterministic=deterministic)
      x_BLE = BiLSTM(self.lstm_size, name=f"bilstm_{i}")(x_BLE, lengths_B)
    x_BLE = nn.Dropout(self.dropout_rate)(x_BLE, deterministic=deterministic)
    return nn.Dense(self.num_outputs, name="classifier")(x_BLE).astype(jnp.float32)


class FeatureModel(nn.Module):
  """{"head": FeatureTagger}: the params tree has the fine-tuning model's "head" and no
  "bert" (the encoder is not part of the trained model)."""

  num_outputs: int
  num_features: int  # K, the hidden states per token
  hidden_size: int  # D
  combine: str = "concat"
  lstm_size: int = 384
  lstm_layers: int = 2
  dropout_rate: float = 0.1

  kind = "tagging"
  inputs = FeatureTagger.inputs

  def example_inputs(self, length: int) -> tuple[Array, Array]:
    shape = (1, length, self.num_features, self.hidden_size)
    return jnp.zeros(shape, jnp.float32), jnp.ones((1, length), jnp.int32)

  @nn.compact
  def __call__(self, features_BLKD: Array, input_mask_BL: Array, *, deterministic: bool = True):
    tagger = FeatureTagger(
      self.num_outputs,
      self.combine,
      self.lstm_size,
      self.lstm_layers,
      self.dropout_rate,
      name="head",
    )
    return tagger(features_BLKD, input_mask_BL, deterministic=deterministic)


def model(config: ml_collections.ConfigDict, cfg: model_config.BertConfig, task) -> FeatureModel:
  """The feature-mode model of `config` for the frozen encoder `cfg` and `task`."""
  f = config.features
  return FeatureModel(
    num_outputs=task.num_outputs,
    num_features=len(resolve_layers(f, cfg.num_layers)),
    hidden_size=cfg.hidden_size,
    combine=f.combine,
    lstm_size=f.lstm_size or cfg.hidden_size // 2,
    lstm_layers=f.lstm_layers,
    dropout_rate=config.model.hidden_dropout_prob,
  )


# ----------------------------------------------------------------------------- features


def make_forward(cfg: model_config.BertConfig, layers: tuple[int, ...], dtype: str):
  """(bert_params, input_ids, segment_ids, input_mask) -> the chosen hidden states
  [B, L, K, D] in `dtype` (to be jitted)."""
  bert = model_lib.BertModel(cfg)

  def forward(params, input_ids, segment_ids, input_mask):
    out = bert.apply(
      {"params": params},
      input_ids,
      segment_ids,
      input_mask,
      deterministic=True,
      output_hidden_states=True,
    )
    return jnp.stack([out["hidden_states"][i] for i in layers], axis=2).astype(dtype)

  return forward


def add_features(
  config: ml_collections.ConfigDict,
  cfg: model_config.BertConfig,
  bert_params: Any,
  data: dict,
  pad_id: int,
  mesh,
  rules,
) -> dict[str, Any]:
  """Adds "features" [L_row, K, D] to every row of every split in `data` ({split: a split with
  its encoded `rows` (bert_jax.finetune.data.Split), or None}), one encoder forward
  per row; returns {"layers", "rows", "batches", "seconds", "bytes"}. `bert_params` None: a
  random encoder (seeded by config.seed; the no-pretraining baseline)."""

  layers = resolve_layers(config.features, cfg.num_layers)
  if bert_params is None:
    ids = jnp.zeros((1, 8), jnp.int32)
    init = model_lib.BertModel(cfg).init(jax.random.key(config.seed), ids, ids, ids)
    bert_params = nn.meta.unbox(init["params"])
  params = jax.device_put(
    params_tree.to_layout(params_tree.unbox_to_numpy(bert_params), cfg.scan_layers),
    sh.replicated(mesh),
  )
  batch_sh = sh.batch_sharding(mesh)
  with sh.mesh_context(mesh, rules):
    forward = jax.jit(
      make_forward(cfg, layers, config.features.dtype),
      in_shardings=(sh.replicated(mesh),) + (batch_sh,) * 3,
      out_shardings=sh.replicated(mesh),
    )
    t0 = time.perf_counter()
    nbytes = n_rows = n_batches = 0
    bl = batches.buckets(config)
    for split in data.values():
      if split is None:
        continue
      rows = split.rows
      for batch in batches.eval_batches(rows, config.data.eval_batch_size, bl, pad_id):
        inputs = sh.to_global(batches.host_slice(batch), mesh)
        h = jax.device_get(forward(params, *(inputs[k] for k in batches.MODEL_INPUTS)))
        n_batches += 1
        for j, r in enumerate(batch["row"]):
          if r >= 0:
            # A copy, so that the batch's array is freed.
            rows[r]["features"] = np.array(h[j, : rows[r]["input_ids"].shape[-1]])
            nbytes += rows[r]["features"].nbytes
            n_rows += 1
  seconds = time.perf_counter() - t0
  return dict(layers=list(layers), rows=n_rows, batches=n_batches, seconds=seconds, bytes=nbytes)


@dataclasses.dataclass(frozen=True)
class FeatureHead:
  """The feature-based mode as fine-tuning's head (bert_jax.finetune.inputs.TaskHead is the
  ordinary one): the frozen encoder's hidden states are added to every row once, a BiLSTM
  tagger trains on them, best/ is a feature head dir. `config`: the fine-tuning config."""

  config: ml_collections.ConfigDict

  def add_inputs(self, cfg, bert_params, data, pad_id, mesh, rules) -> str:
    """Adds the rows' features (`add_features`); returns the line that says so."""
    info = add_features(self.config, cfg, bert_params, data, pad_id, mesh, rules)
    return (
      f"features: hidden states {info['layers']} of every row in {info['seconds']:.1f}s "
      f"({info['bytes'] / 2**20:.0f} MiB, {self.config.features.dtype})"
    )

  def make_model(self, cfg: model_lib.BertConfig, task) -> FeatureModel:
    return model(self.config, cfg, task)

  def save(self, path: str, cfg, params, tokenizer, info: dict[str, Any]) -> None:
    save_head(path, cfg, params, tokenizer, info, self.config.features, self.config.init)


# ----------------------------------------------------------------------------- saving


def save_head(
  path: str,
  cfg: model_config.BertConfig,
  params: Any,
  tokenizer,
  task_info: dict[str, Any],
  f: ml_collections.ConfigDict,
  encoder: str,
) -> None:
  """The best dev point as a feature head dir (see the module docstring): `f` is the run's
  config.features, `encoder` the checkpoint it read (config.init)."""
  from safetensors.numpy import save_file

  info = {
    **task_info,
    "encoder": encoder,
    "features": {
      "row": f.row,
      "layers": list(resolve_layers(f, cfg.num_layers)),
      "combine": f.combine,
      "lstm_size": f.lstm_size or cfg.hidden_size // 2,
      "lstm_layers": f.lstm_layers,
      "dtype": f.dtype,
    },
  }
  # np.array, not ascontiguousarray: that makes gamma's 0-d array 1-d.
  flat = {
    k: np.array(v, order="C") for k, v in trees.flatten(params_tree.unbox_to_numpy(params)).items()
  }
  with files.AtomicDir(path, True) as tmp:
    save_file(flat, str(tmp / HEAD_FILE), metadata={"format": "bert_jax_feature_head"})
    (tmp / kinds.TASK_FILE).write_text(json.dumps(info, indent=2) + "\n")
    cfg_json = json.dumps(dataclasses.asdict(cfg), indent=2, sort_keys=True) + "\n"
    (tmp / ENCODER_CONFIG).write_text(cfg_json)
    if tokenizer is not None:
      tokenizer.save(tmp / TOKENIZER_DIR)


def load_head(path: str) -> tuple[dict[str, Any], Any]:
  """(task.json, head params) of a feature head dir."""
  from safetensors.numpy import load_file

  p = pathlib.Path(path)
  if not (p / HEAD_FILE).is_file():
    raise FileNotFoundError(f"{p}: not a feature head dir (no {HEAD_FILE})")
  info = files.read_json(p / kinds.TASK_FILE)
  return info, trees.unflatten(load_file(str(p / HEAD_FILE)))
