"""The fine-tuning model: BertModel plus one task head, as the paper's Figure 4.

Params are `{"bert": <BertModel params>, "head": {...}}`; the "bert" subtree is exactly the
pretraining one, so any checkpoint the loader reads initialises it, and the head's names are
HuggingFace's (`classifier`, `qa_outputs`) so export maps one to one:

  classification, regression  pooled [CLS] -> dropout -> classifier [D, N]    (N = 1: regression)
  tagging                     every token  -> dropout -> classifier [D, N]
  span_qa                     every token  -> qa_outputs [D, 2] (start, end)
  multiple_choice             [B, C, L] rows -> pooled -> dropout -> classifier [D, 1] -> [B, C]

`bilstm=True` puts a randomly initialised bidirectional LSTM between the encoder and the head
(the "+ BiLSTM" row of Table 5, for the left-to-right model).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp
from jax import Array

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax import sharding as sh
from bert_jax.backends import dropout as dropout_lib
from bert_jax.tasks import kinds


class Head(nn.Module):
  """The task head on the encoder outputs (float32: it is tiny and its logits feed the loss)."""

  cfg: model_config.BertConfig
  kind: str
  num_outputs: int
  bilstm: bool = False

  @nn.compact
  def __call__(self, out: dict[str, Array], deterministic: bool) -> Array:
    cfg = dataclasses.replace(self.cfg, dtype="float32")
    spec = kinds.get(self.kind)
    pooled = spec.pooled
    if self.bilstm:
      d = cfg.hidden_size
      seq = nn.Bidirectional(
        nn.RNN(nn.OptimizedLSTMCell(d // 2, name="lstm_forward")),
        nn.RNN(nn.OptimizedLSTMCell(d // 2, name="lstm_backward")),
        name="bilstm",
      )(out["sequence_output"].astype(jnp.float32), seq_lengths=out["lengths"])
      x = seq[:, 0] if pooled else seq  # the BiLSTM's [CLS] state has read the whole input
    else:
      x = out["pooled_output" if pooled else "sequence_output"].astype(jnp.float32)
    if spec.head_dropout:
      x = dropout_lib.for_config(cfg, cfg.hidden_dropout_prob)(x, deterministic=deterministic)
    return model_lib.Dense((self.num_outputs,), (sh.EMBED, None), cfg, name=spec.head)(x)


class FinetuneModel(nn.Module):
  """BertModel -> Head. Inputs [B, L] ([B, C, L] for multiple choice); returns float32
  logits: [B, N] (pooled kinds), [B, L, N] (tagging), [B, L, 2] (span_qa), [B, C] (choices)."""

  cfg: model_config.BertConfig
  kind: str
  num_outputs: int
  bilstm: bool = False

  def setup(self):
    self.spec = kinds.get(self.kind)
    self.bert = model_lib.BertModel(self.cfg)
    self.head = Head(self.cfg, self.kind, self.num_outputs, self.bilstm)

  def __call__(
    self,
    input_ids: Array,
    segment_ids: Array | None = None,
    input_mask: Array | None = None,
    *,
    deterministic: bool = True,
  ) -> Array:
    if segment_ids is None:
      segment_ids = jnp.zeros_like(input_ids)
    if input_mask is None:
      input_mask = jnp.ones_like(input_ids)
    choices = input_ids.shape[1] if self.spec.choices and input_ids.ndim == 3 else 0
    if choices:  # one row per (example, choice)
      flat = lambda x: x.reshape(-1, x.shape[-1])
      input_ids, segment_ids, input_mask = map(flat, (input_ids, segment_ids, input_mask))
    lengths_B = jnp.sum(input_mask, -1).astype(jnp.int32)
    # The pooled token: [CLS]; a left-to-right model's [CLS] has seen only itself, so it pools
    # its last real token instead (as GPT classifies), through the same pooler.
    pooled_BQ = (jnp.maximum(lengths_B - 1, 0) if self.cfg.causal else 0 * lengths_B)[:, None]
    pooled_only = self.spec.pooled and not self.bilstm
    # A pooled head reads one position of the last layer: run that layer's queries there only
    # (BertConfig.prune_last_layer, as pretraining does at the masked positions).
    prune = pooled_only and self.cfg.last_layer_prunable
    out = self.bert(
      input_ids,
      segment_ids,
      input_mask,
      deterministic=deterministic,
      output_positions_BQ=pooled_BQ if prune else None,
    )
    out["lengths"] = lengths_B
    if pooled_only and self.cfg.causal and not prune:
      h_BD = jnp.take_along_axis(out["sequence_output"], pooled_BQ[:, :, None], axis=1)[:, 0]
      out["pooled_output"] = jnp.tanh(self.bert.pooler(h_BD))
    logits = self.head(out, deterministic).astype(jnp.float32)
    if self.spec.choices:
      return logits.reshape(-1, choices or 1)
    return logits
