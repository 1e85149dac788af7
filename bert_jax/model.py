"""BERT (Devlin et al. 2019) in Flax linen, faithful to the released models and sharded by
logical axes; read from the embeddings to the heads as the paper describes them.

Post-LN Transformer encoder, exact-erf GELU, LayerNorm eps 1e-12, truncated-normal init
(std 0.02), learned positions, 2 token types, tanh pooler, MLM head (dense + GELU + LayerNorm,
decoder tied to the word embeddings plus an output bias) evaluated only at the gathered masked
positions, and a 2-way NSP head. Parameter names map 1:1 onto HuggingFace's
`BertForPreTraining` (see convert.py). The hyper-parameters are `model_config.BertConfig`.

The layers are written once; what runs on a given platform (the array ops, the dropout masks,
the attention implementation, the tied decoder's padding) is asked of `bert_jax.backends`,
whose 'auto' choices come from measurements per platform. Scanned layers: layer_scan.py.

Embedding lookups read the float32 (param_dtype) tables and cast after: the word gather's
gradient is then a float32 scatter-add, the 2-row token-type table is a select and positions a
slice, so no gradient is a low-precision scatter-add (on GPUs its atomics serialise).

Shape key: B batch, L sequence length, Q query positions (L, or the positions a pruned last
layer computes), S key positions (= L), D hidden, H heads, K head dim, F intermediate (FFN),
V vocab, P predicted positions, N layers. A 1 is a size-1 axis.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from bert_jax import backends, layer_scan
from bert_jax import sharding as sh
from bert_jax.backends import attention, dropout, fused_norm

if TYPE_CHECKING:  # (a type for annotations; no name of another module is importable from here)
  from bert_jax.model_config import BertConfig

Array = jax.Array

# ----------------------------------------------------------------------------- building blocks


def gelu(x: Array) -> Array:
  """BERT's exact (erf) GELU, not the tanh approximation."""
  return jax.nn.gelu(x, approximate=False)


def _init(cfg: BertConfig, names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
    nn.initializers.truncated_normal(stddev=cfg.initializer_range), names
  )


def _zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


class Dense(nn.Module):
  """x[..., *in] @ kernel[*in, *features] + bias[*features], in the compute dtype.

  The kernel keeps its N-d shape (e.g. [D, H, K] for a query projection) so that every dim
  carries a logical axis name; nn.DenseGeneral's flat kernel cannot be partitioned that way.
  """

  features: tuple[int, ...]
  axes: tuple[str | None, ...]  # logical names of the kernel dims (inputs then outputs)
  cfg: BertConfig
  contract: int = 1  # how many trailing dims of x are contracted

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.cfg
    in_shape = x.shape[x.ndim - self.contract :]
    kernel = self.param(
      "kernel", _init(cfg, self.axes), (*in_shape, *self.features), cfg.storage_dtype
    )
    bias = self.param("bias", _zeros(self.axes[self.contract :]), self.features, cfg.storage_dtype)
    ops = backends.ops_for(cfg)
    return ops.add_bias(ops.matmul(x, kernel, self.contract, cfg.compute_dtype), bias)


def _layer_norm_fields(cfg: BertConfig) -> dict[str, Any]:
  return dict(
    epsilon=cfg.layer_norm_eps,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.storage_dtype,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (sh.EMBED,)),
    bias_init=_zeros((sh.EMBED,)),
  )


def layer_norm(cfg: BertConfig, name: str) -> nn.Module:
  """LayerNorm over the hidden axis (statistics in float32), params `scale` and `bias`."""
  return backends.ops_for(cfg).layer_norm(**_layer_norm_fields(cfg), name=name)


def add_norm(cfg: BertConfig, name: str, h_BQD: Array, x_BQD: Array, deterministic: bool) -> Array:
  """Post-LN's residual: LayerNorm `name`(x + dropout(h)), the hidden dropout on a sublayer's
  output h (`fused_norm.dropout_add_norm`: one fused kernel where cfg.kernels asks for it)."""
  fields = _layer_norm_fields(cfg)
  return fused_norm.dropout_add_norm(cfg, name, fields, h_BQD, x_BQD, deterministic)


def gather_positions(x_BL: Array, positions_BP: Array) -> Array:
  """x[B, L, ...] at positions[B, P] -> [B, P, ...]."""
  idx = positions_BP.astype(jnp.int32).reshape(positions_BP.shape + (1,) * (x_BL.ndim - 2))
  return jnp.take_along_axis(x_BL, idx, axis=1)


# ----------------------------------------------------------------------------- embeddings


def embedding_lookup(table_VD: Array, ids_BL: Array, dtype: Any) -> Array:
  """Rows `ids` of a (float32) table, cast to `dtype` after the gather, so the gradient is a
  scatter-add in the table's dtype. (nn.Embed casts the table first: its gradient is then a
  bf16 scatter-add, whose atomics serialise on GPUs.) Values equal nn.Embed's."""
  return jnp.take(table_VD, ids_BL, axis=0).astype(dtype)


def small_table_lookup(table_TD: Array, ids_BL: Array, dtype: Any) -> Array:
  """Rows `ids` of a table of a few rows (token types) by selects: the gradient is a masked
  sum per row, not a scatter-add of every token onto 2 rows. Ids outside the table read row 0
  (a gather would give NaN)."""
  rows = table_TD.shape[0]
  out_BLD = jnp.broadcast_to(table_TD[0], (*ids_BL.shape, table_TD.shape[1]))
  for t in range(1, rows):
    out_BLD = jnp.where((ids_BL == t)[..., None], table_TD[t], out_BLD)
  return out_BLD.astype(dtype)


# Up to this many rows a table is read by selects (`small_table_lookup`), above by a gather.
SMALL_TABLE_ROWS = 16


class Embeddings(nn.Module):
  """Word + learned position + token type embeddings, LayerNorm, dropout.

  The tables are nn.Embed parameters (names, shapes and init as HuggingFace's), read by
  `embedding_lookup`, a slice (positions) and `small_table_lookup` (token types)."""

  cfg: BertConfig

  def setup(self):
    cfg = self.cfg
    # setup (not compact) so BertForPreTraining can tie the MLM decoder to this table.
    self.word_embeddings = nn.Embed(
      cfg.vocab_size,
      cfg.hidden_size,
      embedding_init=_init(cfg, (sh.VOCAB, sh.EMBED)),
      param_dtype=cfg.storage_dtype,
      dtype=cfg.compute_dtype,
    )
    self.position_embeddings = nn.Embed(
      cfg.max_position_embeddings,
      cfg.hidden_size,
      embedding_init=_init(cfg, (None, sh.EMBED)),
      param_dtype=cfg.storage_dtype,
      dtype=cfg.compute_dtype,
    )
    self.token_type_embeddings = nn.Embed(
      cfg.type_vocab_size,
      cfg.hidden_size,
      embedding_init=_init(cfg, (None, sh.EMBED)),
      param_dtype=cfg.storage_dtype,
      dtype=cfg.compute_dtype,
    )
    self.LayerNorm = layer_norm(cfg, "LayerNorm")
    self.dropout = dropout.for_config(cfg, cfg.hidden_dropout_prob)

  def __call__(self, input_ids_BL: Array, segment_ids_BL: Array, deterministic: bool) -> Array:
    cfg = self.cfg
    length = input_ids_BL.shape[1]
    if length > cfg.max_position_embeddings:
      raise ValueError(
        f"sequence length {length} exceeds max_position_embeddings {cfg.max_position_embeddings}"
      )
    dtype = cfg.compute_dtype
    x_BLD = embedding_lookup(self.word_embeddings.embedding, input_ids_BL, dtype)
    x_BLD = x_BLD + self.position_embeddings.embedding[:length].astype(dtype)[None]
    types_TD = self.token_type_embeddings.embedding
    if types_TD.shape[0] <= SMALL_TABLE_ROWS:
      x_BLD = x_BLD + small_table_lookup(types_TD, segment_ids_BL, dtype)
    else:
      x_BLD = x_BLD + embedding_lookup(types_TD, segment_ids_BL, dtype)
    x_BLD = self.LayerNorm(x_BLD)
    x_BLD = self.dropout(x_BLD, deterministic=deterministic)
    return _constrain(x_BLD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

  def attend(self, h_BPD: Array) -> Array:
    """Logits against the word embeddings (the tied MLM decoder), float32 [B, P, V]."""
    return backends.decoder_logits(self.cfg, h_BPD, self.word_embeddings.embedding)


# ----------------------------------------------------------------------------- attention


def self_attention(
  cfg: BertConfig,
  xq_BQD: Array,
  x_BSD: Array,
  input_mask_BS: Array,
  positions_BQ: Array | None,
  deterministic: bool,
  output_attentions: bool,
) -> tuple[Array, Array | None]:
  """Multi-head self-attention with queries from `xq_BQD` (at `positions_BQ`, default every
  position), keys and values from `x_BSD`, then the output projection: ([B, Q, D], the
  probabilities when asked for, else None). The attention itself is `attention.attend`'s.

  Called inside `Layer`, whose params (`query`, `key`, `value`, `attention_output`) these are.
  """
  h, k = cfg.num_heads, cfg.head_dim
  qkv_axes = (sh.EMBED, sh.HEADS, sh.KV)
  act = (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_HEADS, sh.ACT_KV)
  q_BQHK = _constrain(Dense((h, k), qkv_axes, cfg, name="query")(xq_BQD), act)
  k_BSHK = _constrain(Dense((h, k), qkv_axes, cfg, name="key")(x_BSD), act)
  v_BSHK = _constrain(Dense((h, k), qkv_axes, cfg, name="value")(x_BSD), act)
  ctx_BQHK, probs_BHQS = attention.attend(
    cfg,
    q_BQHK,
    k_BSHK,
    v_BSHK,
    input_mask_BS,
    positions_BQ,
    deterministic=deterministic,
    output_attentions=output_attentions,
  )
  ctx_BQHK = _constrain(ctx_BQHK, act)
  out_BQD = Dense(
    (cfg.hidden_size,), (sh.HEADS, sh.KV, sh.EMBED), cfg, contract=2, name="attention_output"
  )(ctx_BQHK)
  return out_BQD, probs_BHQS


# ----------------------------------------------------------------------------- layer


class Layer(nn.Module):
  """One post-LN Transformer layer (self-attention, FFN), as the original BERT."""

  cfg: BertConfig
  deterministic: bool = True
  output_attentions: bool = False

  @nn.compact
  def __call__(
    self, x_BLD: Array, input_mask_BL: Array, positions_BQ: Array | None = None
  ) -> tuple[Array, Array | None]:
    """[B, L, D] -> [B, Q, D]: with `positions_BQ` only those positions' outputs (the queries,
    attention output and FFN run at the Q gathered positions, keys and values at all L),
    else Q = L. Keys where `input_mask_BL` is 0 are never attended."""
    cfg = self.cfg
    xq_BQD = x_BLD if positions_BQ is None else gather_positions(x_BLD, positions_BQ)
    attn_BQD, probs_BHQS = self_attention(
      cfg, xq_BQD, x_BLD, input_mask_BL, positions_BQ, self.deterministic, self.output_attentions
    )
    x_BQD = add_norm(cfg, "attention_LayerNorm", attn_BQD, xq_BQD, self.deterministic)
    x_BQD = _constrain(x_BQD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))

    ff_BQF = Dense((cfg.intermediate_size,), (sh.EMBED, sh.MLP), cfg, name="intermediate")(x_BQD)
    activation = layer_scan.recomputed_gelu if cfg.remat_policy == "gelu" else gelu
    ff_BQF = _constrain(activation(ff_BQF), (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_MLP))
    ff_BQD = Dense((cfg.hidden_size,), (sh.MLP, sh.EMBED), cfg, name="output")(ff_BQF)
    x_BQD = add_norm(cfg, "output_LayerNorm", ff_BQD, x_BQD, self.deterministic)
    x_BQD = _constrain(x_BQD, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_EMBED))
    return x_BQD, probs_BHQS


# ----------------------------------------------------------------------------- encoder


class Encoder(nn.Module):
  """N layers, unrolled (`layer_{i}`) or scanned (`layers/layer`, leading layer axis)."""

  cfg: BertConfig

  @nn.compact
  def __call__(
    self,
    x_BLD: Array,
    input_mask_BL: Array,
    deterministic: bool,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    last_positions_BQ: Array | None = None,
  ):
    """(last hidden state, hidden states, attentions). `last_positions_BQ` (unrolled layers,
    or scanned with `unroll_last_layer`): the last layer's outputs only at those positions
    ([B, Q, D]; see `BertConfig.prune_last_layer`)."""
    cfg = self.cfg
    if last_positions_BQ is not None and cfg.scan_layers and not cfg.unroll_last_layer:
      raise ValueError(
        "output positions (a pruned last layer) need unrolled layers: scan_layers=False, or "
        "unroll_last_layer=True"
      )
    dropping = not deterministic and cfg.attention_dropout_prob > 0
    # Once per trace of the model: every layer makes the same choice.
    logging.info(backends.attention_line(cfg, x_BLD.shape[1], dropping, output_attentions))
    hidden, attentions = [x_BLD], []
    if cfg.scan_layers and last_positions_BQ is not None:
      layers = layer_scan.scanned_then_last(Layer, self.is_initializing())
      x_BLD = layers(cfg, deterministic, name="layers")(x_BLD, input_mask_BL, last_positions_BQ)
    elif cfg.scan_layers:
      x_BLD, (h_NBLD, p_NBHLS) = layer_scan.scanned(Layer, cfg.num_layers)(
        cfg, deterministic, output_hidden_states, output_attentions, name="layers"
      )(x_BLD, input_mask_BL)
      if output_hidden_states:
        hidden += list(h_NBLD)
      if output_attentions:
        attentions = list(p_NBHLS)
    else:
      layer_cls = layer_scan.remat(Layer, cfg, prevent_cse=True)
      for i in range(cfg.num_layers):
        last = i == cfg.num_layers - 1
        positions_BQ = last_positions_BQ if last else None
        x_BLD, probs_BHQS = layer_cls(cfg, deterministic, output_attentions, name=f"layer_{i}")(
          x_BLD, input_mask_BL, positions_BQ
        )
        hidden.append(x_BLD)
        attentions.append(probs_BHQS)
    return (
      x_BLD,
      tuple(hidden) if output_hidden_states else None,
      tuple(attentions) if output_attentions else None,
    )


class BertModel(nn.Module):
  """Embeddings -> encoder -> tanh pooler. Returns a dict of outputs."""

  cfg: BertConfig

  def setup(self):
    self.embeddings = Embeddings(self.cfg)
    self.encoder = Encoder(self.cfg)
    self.pooler = Dense((self.cfg.hidden_size,), (sh.EMBED, sh.EMBED_OUT), self.cfg)

  def __call__(
    self,
    input_ids_BL: Array,
    segment_ids_BL: Array | None = None,
    input_mask_BL: Array | None = None,
    *,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    output_positions_BQ: Array | None = None,
  ) -> dict[str, Any]:
    """`output_positions_BQ` (position 0 first; `BertConfig.last_layer_prunable`): compute
    the last layer only at those positions; `sequence_output` is then [B, Q, D] at them and
    the pooler reads its first row (see `BertConfig.prune_last_layer`)."""
    if segment_ids_BL is None:
      segment_ids_BL = jnp.zeros_like(input_ids_BL)
    if input_mask_BL is None:
      input_mask_BL = jnp.ones_like(input_ids_BL)
    x_BLD = self.embeddings(input_ids_BL, segment_ids_BL, deterministic)
    x_BQD, hidden, attentions = self.encoder(
      x_BLD,
      input_mask_BL,
      deterministic,
      output_hidden_states,
      output_attentions,
      output_positions_BQ,
    )
    pooled_BD = jnp.tanh(self.pooler(x_BQD[:, 0]))
    out = {"sequence_output": x_BQD, "pooled_output": pooled_BD}
    if output_hidden_states:
      out["hidden_states"] = hidden
    if output_attentions:
      out["attentions"] = attentions
    return out


# ----------------------------------------------------------------------------- heads


class MLMHead(nn.Module):
  """transform (dense + GELU + LayerNorm) then the tied decoder plus an output bias."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, h_BPD: Array, embeddings: Embeddings) -> Array:
    cfg = self.cfg
    h_BPD = Dense((cfg.hidden_size,), (sh.EMBED, sh.EMBED_OUT), cfg, name="transform")(h_BPD)
    h_BPD = layer_norm(cfg, "transform_LayerNorm")(gelu(h_BPD))
    bias_V = self.param("bias", _zeros((sh.VOCAB,)), (cfg.vocab_size,), cfg.storage_dtype)
    logits_BPV = backends.ops_for(cfg).add_bias(embeddings.attend(h_BPD), bias_V)
    return _constrain(logits_BPV, (sh.ACT_BATCH, sh.ACT_LENGTH, sh.ACT_VOCAB))


def nsp_head(cfg: BertConfig) -> Dense:
  """The 2-way next-sentence head on the pooled output, in float32 whatever the compute
  dtype (free at 2 outputs)."""
  return Dense((2,), (sh.EMBED, None), dataclasses.replace(cfg, dtype="float32"))


# ----------------------------------------------------------------------------- pretraining


class BertForPreTraining(nn.Module):
  """BertModel + MLM head (at `masked_positions`, or every position if None) + NSP head.

  With masked positions and `cfg.last_layer_prunable` (no hidden states or attentions asked
  for), the last layer runs only where the heads read, and the outputs have no
  `sequence_output`.

  For the left-to-right objective pass every position (or None); the same tied head then
  predicts the next token.
  """

  cfg: BertConfig

  def setup(self):
    self.bert = BertModel(self.cfg)
    self.predictions = MLMHead(self.cfg)
    self.seq_relationship = nsp_head(self.cfg)

  def __call__(
    self,
    input_ids_BL: Array,
    segment_ids_BL: Array | None = None,
    input_mask_BL: Array | None = None,
    masked_positions_BP: Array | None = None,
    *,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
  ) -> dict[str, Any]:
    cfg = self.cfg
    prune = (
      masked_positions_BP is not None
      and cfg.last_layer_prunable
      and not output_hidden_states
      and not output_attentions
    )
    out = self.bert(
      input_ids_BL,
      segment_ids_BL,
      input_mask_BL,
      deterministic=deterministic,
      output_hidden_states=output_hidden_states,
      output_attentions=output_attentions,
      # [CLS] (for the pooler) then the masked positions: Q = 1 + P.
      output_positions_BQ=(
        jnp.pad(masked_positions_BP.astype(jnp.int32), ((0, 0), (1, 0))) if prune else None
      ),
    )
    if prune:  # the last layer ran at [CLS] + the masked positions only
      h_BPD = out.pop("sequence_output")[:, 1:]
    elif masked_positions_BP is None:
      h_BPD = out["sequence_output"]
    else:
      h_BPD = gather_positions(out["sequence_output"], masked_positions_BP)
    out["mlm_logits"] = self.predictions(h_BPD, self.bert.embeddings)
    out["nsp_logits"] = self.seq_relationship(out["pooled_output"]).astype(jnp.float32)
    return out


# ----------------------------------------------------------------------------- init, counts, FLOPs


def dummy_inputs(batch: int = 1, length: int = 8) -> tuple[Array, Array, Array]:
  ids = jnp.zeros((batch, length), jnp.int32)
  return ids, ids, jnp.ones_like(ids)


def init_params(model: nn.Module, rng: Array, length: int = 8) -> Any:
  """Boxed params (LogicallyPartitioned leaves); unbox with nn.meta.unbox."""
  return model.init({"params": rng}, *dummy_inputs(1, length))["params"]


def count_params(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(nn.meta.unbox(params)))


@functools.cache
def abstract_params(cfg: BertConfig, pretraining: bool = True) -> Any:
  """Unboxed ShapeDtypeStructs of the params, without any compute."""
  model = BertForPreTraining(cfg) if pretraining else BertModel(cfg)
  boxed = jax.eval_shape(lambda r: init_params(model, r), jax.random.key(0))
  return nn.meta.unbox(boxed)


def train_flops_per_token(cfg: BertConfig, seq_len: int, predictions_per_seq: int) -> float:
  """Model FLOPs per token of one training step (3x the forward matmul FLOPs).

  Encoder matmuls, attention scores and values (the full L x L is computed even when causal),
  the MLM head at the positions actually computed (`predictions_per_seq`; = seq_len for LTR or
  an all-position head) and the pooler + NSP head (once per sequence). With a pruned last
  layer (`BertConfig.last_layer_prunable`, masked positions) that layer counts at the 1 +
  predictions_per_seq positions it computes, its key and value projections at every position.
  """
  n, d, f, v = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
  per_layer = 6 * (4 * d * d + 2 * d * f) + 12 * d * seq_len
  encoder = n * per_layer
  if cfg.last_layer_prunable and predictions_per_seq < seq_len:
    q = (1 + predictions_per_seq) / seq_len  # share of positions the last layer computes
    last = 6 * 2 * d * d + q * (6 * (2 * d * d + 2 * d * f) + 12 * d * seq_len)
    encoder += last - per_layer
  head = 6 * (d * d + d * v) * predictions_per_seq / seq_len
  pooler_nsp = 6 * (d * d + 2 * d) / seq_len
  return float(encoder + head + pooler_nsp)
