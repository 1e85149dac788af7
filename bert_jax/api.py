"""Notebook API: `bert_jax.load(path)` -> a model to probe, fill masks with, or embed text.

Works in a plain single-device process with no mesh, whatever mesh the checkpoint was saved
on (orbax restores onto the target shardings we give it: one device).

  m = bert_jax.load("/tmp/bert_local")
  m.fill_mask("the man went to the [MASK] .")
  m.embed(["a sentence"], layers=(-1, -2, -3, -4))
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import checkpoints as ckpt_lib
from bert_jax import model as model_lib
from bert_jax import tokenizer as tokenizer_lib

MASK_TEXT = "[MASK]"


@dataclasses.dataclass
class Embedded:
  """Per text: its wordpieces (with [CLS]/[SEP]) and hidden states [num_layers, T, D]."""

  tokens: list[list[str]]
  hidden: list[np.ndarray]


class Bert:
  """A loaded checkpoint: `config` (BertConfig), `params`, `tokenizer`, `meta`, `step`."""

  def __init__(self, config: model_lib.BertConfig, params: Any, tokenizer, meta: dict, step: int):
    self.config = config
    self.params = params
    self.tokenizer = tokenizer
    self.meta = meta
    self.step = step
    self.model = model_lib.BertForPreTraining(config)

  def __repr__(self) -> str:
    c = self.config
    return (
      f"Bert(L={c.num_layers}, H={c.hidden_size}, A={c.num_heads}, vocab={c.vocab_size}, "
      f"step={self.step}, params={model_lib.count_params(self.params):,})"
    )

  @functools.partial(jax.jit, static_argnums=(0, 5))
  def _forward(self, params, ids, segments, mask, hidden_states: bool):
    return self.model.apply(
      {"params": params}, ids, segments, mask, None, output_hidden_states=hidden_states
    )

  def _batch(self, id_lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    longest = max(len(x) for x in id_lists)
    if longest > self.config.max_position_embeddings:
      raise ValueError(
        f"text is {longest} tokens; the model takes at most {self.config.max_position_embeddings}"
      )
    length = min(-(-longest // 16) * 16, self.config.max_position_embeddings)  # few shapes
    ids = np.zeros((len(id_lists), length), np.int32)
    mask = np.zeros_like(ids)
    for i, x in enumerate(id_lists):
      ids[i, : len(x)] = x
      mask[i, : len(x)] = 1
    return ids, mask

  def _encode_with_masks(self, text: str) -> list[int]:
    """Wordpieces of `text` with each literal [MASK] becoming the mask id (the tokenizer
    itself, like BERT's, splits a literal "[MASK]" into '[', 'mask', ']')."""
    tok = self.tokenizer
    ids = [tok.cls_id]
    for i, part in enumerate(text.split(MASK_TEXT)):
      if i:
        ids.append(tok.mask_id)
      if part.strip():
        ids.extend(tok.encode(part))
    ids.append(tok.sep_id)
    return ids

  def fill_mask(self, texts: str | list[str], top_k: int = 5) -> list:
    """For each [MASK] in each text: the top_k (token, probability) predictions.

    A single string returns a list (one entry per mask) of lists of (token, prob); a list of
    strings returns one such list per text.
    """
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)
    id_lists = [self._encode_with_masks(t) for t in texts]
    for t, x in zip(texts, id_lists, strict=True):
      if self.tokenizer.mask_id not in x:
        raise ValueError(f"no {MASK_TEXT} in {t!r}")
    ids, mask = self._batch(id_lists)
    out = self._forward(self.params, ids, np.zeros_like(ids), mask, False)
    probs = np.asarray(jax.nn.softmax(out["mlm_logits"], axis=-1))
    results = []
    for i, x in enumerate(id_lists):
      per_mask = []
      for pos in [p for p, t in enumerate(x) if t == self.tokenizer.mask_id]:
        top = np.argsort(-probs[i, pos])[:top_k]
        per_mask.append(
          [(self.tokenizer.id_to_token(int(t)), float(probs[i, pos, t])) for t in top]
        )
      results.append(per_mask)
    return results[0] if single else results

  def embed(self, texts: list[str], layers: tuple[int, ...] = (-1,)) -> Embedded:
    """Hidden states of the chosen layers (0 = embeddings, -1 = last layer), per token."""
    id_lists = [
      [self.tokenizer.cls_id, *self.tokenizer.encode(t), self.tokenizer.sep_id] for t in texts
    ]
    ids, mask = self._batch(id_lists)
    out = self._forward(self.params, ids, np.zeros_like(ids), mask, True)
    hidden = jnp.stack(out["hidden_states"])  # [N+1, B, L, D]
    chosen = np.asarray(hidden[np.array(layers)])  # [len(layers), B, L, D]
    return Embedded(
      tokens=[[self.tokenizer.id_to_token(t) for t in x] for x in id_lists],
      hidden=[chosen[:, i, : len(x)] for i, x in enumerate(id_lists)],
    )


def _find_tokenizer(path: str, meta: dict):
  candidates = [os.path.join(path, "tokenizer")]
  if meta.get("data_dir"):
    candidates.append(os.path.join(meta["data_dir"], "tokenizer"))
  for c in candidates:
    if os.path.isdir(c):
      tok = tokenizer_lib.load_tokenizer(c)
      want = meta.get("tokenizer", {}).get("fingerprint")
      if want and tok.fingerprint != want:
        raise ValueError(f"tokenizer at {c} does not match the checkpoint's fingerprint")
      return tok
  return None


def load(path: str, step: int | None = None, device: Any = None) -> Bert:
  """Loads the latest (or `step`) checkpoint of a workdir onto one device."""
  path = os.path.abspath(os.fspath(path))
  meta, step, _ = ckpt_lib.read_meta(path, step)
  cfg = ckpt_lib.bert_config_from_meta(meta, remat_policy="none")
  cfg = model_lib.resolve_kernels(cfg, (device or jax.devices()[0]).platform)
  target = ckpt_lib.single_device_target(model_lib.abstract_params(cfg), device)
  params, _ = ckpt_lib.restore_params(path, target, step)
  workdir = (
    path
    if os.path.isdir(os.path.join(path, "checkpoints"))
    else os.path.dirname(ckpt_lib.checkpoint_dir(path).rstrip("/"))
  )
  return Bert(cfg, params, _find_tokenizer(workdir, meta), meta, step)
