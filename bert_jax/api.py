"""Notebook API: `bert_jax.load(path)` -> a model to probe, fill masks with, or embed text.

`path` is anything `loader.load_checkpoint` reads: a training workdir (latest step, or
`step=`), one orbax step, a HuggingFace dir, a Google TF checkpoint or a params dir. Works in a
plain single-device process with no mesh, whatever mesh the checkpoint was saved on.

  m = bert_jax.load("/tmp/bert_local")  # dtype="float32" to compute in float32
  m.fill_mask("the man went to the [MASK] .")
  m.embed(["a sentence"], layers=(-1, -2, -3, -4))

A BertModel checkpoint (no MLM/NSP heads, e.g. a sentence-embedding model) embeds but cannot
fill masks.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import backends, model_config, params_tree
from bert_jax import model as model_lib
from bert_jax.interop import loader
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.tokenizers.tokenizer import MASK_TEXT

DTYPES = ("float32", "bfloat16", "float16")  # the compute dtypes `load` takes


@dataclasses.dataclass
class Embedded:
  """Per text: its wordpieces (with [CLS]/[SEP]) and hidden states [num_layers, T, D]."""

  tokens: list[list[str]]
  hidden: list[np.ndarray]


class Bert:
  """A loaded checkpoint: `config` (BertConfig), `params`, `tokenizer`, `meta`, `step`
  (None outside a workdir) and `format` (see `loader.FORMATS`)."""

  def __init__(
    self,
    config: model_config.BertConfig,
    params: Any,
    tokenizer,
    meta: dict,
    step: int | None,
    format: str = "workdir",
  ):
    self.config = config
    self.params = params
    self.tokenizer = tokenizer
    self.meta = meta
    self.step = step
    self.format = format
    self.has_heads = params_tree.is_pretraining(params)
    self.model = (model_lib.BertForPreTraining if self.has_heads else model_lib.BertModel)(config)

  def __repr__(self) -> str:
    c = self.config
    return (
      f"Bert(L={c.num_layers}, H={c.hidden_size}, A={c.num_heads}, vocab={c.vocab_size}, "
      f"step={self.step}, params={model_lib.count_params(self.params):,})"
    )

  @functools.partial(jax.jit, static_argnums=(0, 5, 6))
  def _forward(self, params, ids, segments, mask, hidden_states: bool, attentions: bool = False):
    return self.model.apply(
      {"params": params},
      ids,
      segments,
      mask,
      output_hidden_states=hidden_states,
      output_attentions=attentions,
    )

  def _need_tokenizer(self) -> None:
    if self.tokenizer is None:
      raise ValueError(
        "this checkpoint has no tokenizer: set `.tokenizer` (tokenizer.load_tokenizer)"
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
    if not self.has_heads:
      raise ValueError("a BertModel checkpoint has no MLM head: fill_mask needs BertForPreTraining")
    self._need_tokenizer()
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)
    if not isinstance(top_k, int) or top_k < 1:
      raise ValueError(f"top_k must be an integer >= 1, not {top_k!r}")
    if not texts:
      return []
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

  def attention(self, text: str, layer: int = -1) -> tuple[list[str], np.ndarray]:
    """(wordpieces with [CLS]/[SEP], attention probabilities [heads, T, T] of `layer`: 0 is
    the first layer, -1 the last); row q is how query q distributes over the keys."""
    self._need_tokenizer()
    n_layers = self.config.num_layers
    if not isinstance(layer, int) or not -n_layers <= layer < n_layers:
      raise ValueError(
        f"layer={layer!r}: this model has {n_layers} layers (0 .. {n_layers - 1}, or -1 for the "
        "last)"
      )
    ids_list = [self.tokenizer.cls_id, *self.tokenizer.encode(text), self.tokenizer.sep_id]
    ids, mask = self._batch([ids_list])
    out = self._forward(self.params, ids, np.zeros_like(ids), mask, False, True)
    n = len(ids_list)
    probs = np.asarray(out["attentions"][layer][0, :, :n, :n])
    return [self.tokenizer.id_to_token(t) for t in ids_list], probs

  def embed(self, texts: list[str], layers: tuple[int, ...] = (-1,)) -> Embedded:
    """Hidden states of the chosen layers (0 = embeddings, -1 = last layer), per token."""
    self._need_tokenizer()
    if isinstance(texts, str):
      raise ValueError("embed takes a list of texts: embed([text])")
    n = self.config.num_layers
    for i in layers:
      if not isinstance(i, int) or not -(n + 1) <= i <= n:
        raise ValueError(
          f"layers={tuple(layers)!r}: hidden state {i!r} is not one of this model's: 0 (the "
          f"embeddings) .. {n} (the last layer), or -1 .. -{n + 1} from the last"
        )
    if not texts:
      return Embedded(tokens=[], hidden=[])
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


def load(path: str, step: int | None = None, device: Any = None, dtype: str | None = None) -> Bert:
  """Loads any checkpoint (the latest or `step` of a workdir) onto one device. A workdir's
  latest step that does not load (a truncated or corrupt file) is named in one warning and the
  one before is tried, as the trainer does. `dtype` is the compute dtype ('float32', 'bfloat16',
  'float16'); None computes in the checkpoint's own (the run's `model.dtype`: bfloat16 for the
  bundled default on a CPU with bf16 instructions). The weights keep their stored dtype."""
  if dtype is not None:
    try:
      name = jnp.dtype(dtype).name
    except TypeError:  # 'float17'
      name = None
    if name not in DTYPES:
      raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (or None), not {dtype!r}")
    dtype = name
  target_device = device or jax.devices()[0]
  if step is None and loader.detect_format(path) == "workdir":
    ck = ckpt_lib.load_newest(path, lambda s: loader.load_checkpoint(path, s))
  else:
    ck = loader.load_checkpoint(path, step)
  dtype = ck.config.dtype if dtype is None else dtype
  cfg = dataclasses.replace(ck.config, remat_policy="none", dtype=dtype)
  cfg = backends.resolve_kernels(cfg, target_device.platform)
  params = jax.device_put(ck.params, target_device)
  return Bert(cfg, params, ck.tokenizer, ck.meta, ck.step, ck.format)
