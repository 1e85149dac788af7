"""Pretraining objectives as config switches: MLM, NSP and left-to-right LM (LTR).

`prepare` turns a host batch into model inputs and targets (masking on device, a pure
function of the example ids and the seed); `losses` computes summed losses and counts so that
gradient accumulation and multi-step metrics aggregate exactly.

Shape key: B batch, L length, P predicted positions, V vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax import masking

Array = jax.Array


def lm_name(ltr: bool) -> str:
  """The token objective's name, the prefix of its metrics (`mlm_loss`, `ltr_accuracy`, ...)."""
  return "ltr" if ltr else "mlm"


@dataclasses.dataclass(frozen=True)
class Objective:
  mlm: bool = True
  nsp: bool = True
  ltr: bool = False
  dynamic_masking: bool = False  # False: static (mask fixed per example id), True: per epoch
  mask_seed: int = 0
  masking: masking.MaskingConfig = masking.MaskingConfig()

  def __post_init__(self):
    if self.mlm == self.ltr:
      raise ValueError("config.objective: exactly one of mlm and ltr must be true")

  @classmethod
  def from_config(cls, c: Any) -> Objective:
    return cls(
      mlm=c.objective.mlm,
      nsp=c.objective.nsp,
      ltr=c.objective.ltr,
      dynamic_masking=c.masking.mode == "dynamic",
      mask_seed=c.masking.seed,
      masking=masking.MaskingConfig(
        max_predictions=c.masking.max_predictions,
        masked_lm_prob=c.masking.prob,
        whole_word=c.masking.whole_word,
      ),
    )


def prepare(batch: dict[str, Array], obj: Objective, tables: Any) -> dict[str, Array]:
  """Model inputs and targets for a batch: MLM masking (unless written masks are present) or
  LTR next-token targets."""
  out = {
    "input_ids": batch["input_ids"],
    "segment_ids": batch["segment_ids"],
    "input_mask": batch["input_mask"],
    "next_sentence_label": batch["next_sentence_label"],
    # Padding examples (eval's last batch) have an all-zero input mask.
    "example_weight": batch["input_mask"][:, 0].astype(jnp.float32),
  }
  if obj.ltr:
    out["targets"], w = masking.ltr_targets(batch["input_ids"], batch["input_mask"])
    out["target_weights"] = w.astype(jnp.float32)
    return out
  if "masked_lm_positions" in batch:  # masks written by create_data --write_masks
    out["input_ids"] = batch["input_ids"]
    out["positions"] = batch["masked_lm_positions"]
    out["targets"] = batch["masked_lm_ids"]
    out["target_weights"] = batch["masked_lm_weights"].astype(jnp.float32)
    return out
  epoch = batch["epoch"] if obj.dynamic_masking else None
  m = masking.mask_batch(
    obj.mask_seed,
    batch["example_id"],
    epoch,
    batch["input_ids"],
    batch["input_mask"],
    tables,
    obj.masking,
  )
  out["input_ids"] = m["input_ids"]
  out["positions"] = m["masked_lm_positions"]
  out["targets"] = m["masked_lm_ids"]
  out["target_weights"] = m["masked_lm_weights"].astype(jnp.float32)
  return out


def forward(model, params, inputs: dict[str, Array], *, deterministic: bool, rng=None):
  rngs = None if deterministic else {"dropout": rng}
  return model.apply(
    {"params": params},
    inputs["input_ids"],
    inputs["segment_ids"],
    inputs["input_mask"],
    inputs.get("positions"),  # None for LTR: the head runs at every position
    deterministic=deterministic,
    rngs=rngs,
  )


def _token_ce(logits_BPV: Array, targets_BP: Array, weights_BP: Array):
  logits_BPV = logits_BPV.astype(jnp.float32)
  # logsumexp minus the target's logit, picked by a one-hot compare: its gradient is fused
  # element-wise work (take_along_axis would scatter into a zero [B, P, V] buffer).
  onehot_BPV = jnp.arange(logits_BPV.shape[-1]) == targets_BP[..., None].astype(jnp.int32)
  target_logit_BP = jnp.sum(jnp.where(onehot_BPV, logits_BPV, 0.0), axis=-1)
  # logsumexp as jax.nn.logsumexp computes it, around the row max that the accuracy reuses:
  # a target is right when its logit is the row's largest (argmax's answer but on an exact tie,
  # which counts every tied logit as right). No argmax: it would be one more pass over the
  # [B, P, V] logits (a variadic max + index reduction) in every train step.
  max_BP = jax.lax.stop_gradient(jnp.max(logits_BPV, axis=-1))
  lse_BP = max_BP + jnp.log(jnp.sum(jnp.exp(logits_BPV - max_BP[..., None]), axis=-1))
  nll_BP = lse_BP - target_logit_BP
  correct_BP = (target_logit_BP >= max_BP).astype(jnp.float32)
  return jnp.sum(nll_BP * weights_BP), jnp.sum(correct_BP * weights_BP), jnp.sum(weights_BP)


def losses(outputs: dict[str, Array], inputs: dict[str, Array], obj: Objective) -> dict[str, Array]:
  """Summed losses, correct counts and weights (float32 scalars), keyed by objective."""
  sums = {}
  name = lm_name(obj.ltr)
  loss, correct, count = _token_ce(
    outputs["mlm_logits"], inputs["targets"], inputs["target_weights"]
  )
  sums.update({f"{name}_loss": loss, f"{name}_correct": correct, f"{name}_count": count})
  if obj.nsp:
    w_B = inputs["example_weight"]
    loss, correct, count = _token_ce(
      outputs["nsp_logits"][:, None], inputs["next_sentence_label"][:, None], w_B[:, None]
    )
    sums.update({"nsp_loss": loss, "nsp_correct": correct, "nsp_count": count})
  return sums


def total_loss(sums: dict[str, Array], totals: dict[str, Array], obj: Objective) -> Array:
  """BERT's loss: mean token loss of the LM objective (+ mean NSP loss), normalised by the
  totals of the whole (accumulated) batch so micro-batching changes nothing."""
  name = lm_name(obj.ltr)
  loss = sums[f"{name}_loss"] / jnp.maximum(totals[f"{name}_count"], 1.0)
  if obj.nsp:
    loss = loss + sums["nsp_loss"] / jnp.maximum(totals["nsp_count"], 1.0)
  return loss


def counts(inputs: dict[str, Array], obj: Objective) -> dict[str, Array]:
  name = lm_name(obj.ltr)
  out = {f"{name}_count": jnp.sum(inputs["target_weights"])}
  if obj.nsp:
    out["nsp_count"] = jnp.sum(inputs["example_weight"])
  return out


def summarize(sums: dict[str, float]) -> dict[str, float]:
  """Host-side: turns accumulated sums into means (loss, accuracy, perplexity)."""
  out = {}
  for name in ("mlm", "ltr", "nsp"):
    n = sums.get(f"{name}_count")
    if not n:
      continue
    out[f"{name}_loss"] = sums[f"{name}_loss"] / n
    out[f"{name}_accuracy"] = sums[f"{name}_correct"] / n
    if name != "nsp":
      out[f"{name}_perplexity"] = float(jnp.exp(min(out[f"{name}_loss"], 50.0)))
  if sums.get("mlm_at_mask_count"):
    out["mlm_accuracy_at_mask"] = sums["mlm_at_mask_correct"] / sums["mlm_at_mask_count"]
  return out
