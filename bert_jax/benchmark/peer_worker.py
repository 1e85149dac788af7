"""Times one HuggingFace BertForPreTraining train step (Flax or PyTorch), or with
`spec['task'] == 'finetune'` one PyTorch BertForSequenceClassification step: the benchmark's peer.

  PEER_PYTHON path/to/bert_jax/benchmark/peer_worker.py '<json spec from peers.peer_spec>'

Runs by path in an interpreter that has torch/transformers (and jax/flax/optax for `hf_flax`)
but not necessarily bert_jax: it imports only those, numpy, the standard library and its two
siblings `host.py`, `protocol.py` and `batches.py`. Its pretraining step: forward (MLM logits at
every position, as HF computes them), MLM loss on 15% of the positions + NSP loss, backward,
AdamW (no decay for biases and LayerNorm), dropout `spec['dropout']`. Its fine-tuning step, on
`batches.pair_batch` (the arrays ours times): SDPA attention, cross-entropy over
`spec['num_labels']` classes, backward, global-norm clipping at 1.0, AdamW as above with the
warmup + linear decay schedule stepped, as the fine-tuning recipe runs. Prints its record as
`protocol.RESULT_MARK <json>`; with `spec['serve']` it steps on request first (`protocol.serve`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

if __package__:
  from bert_jax.benchmark import batches, host, protocol
else:  # run by path: the siblings come from this file's directory, sys.path[0]
  import batches
  import host
  import protocol

  del sys.path[0]  # no other file here may shadow a module that torch or jax imports


def _hf_config(spec: dict[str, Any], **extra: Any) -> Any:
  import transformers

  return transformers.BertConfig(
    **extra,
    vocab_size=spec["vocab"],
    hidden_size=spec["hidden"],
    num_hidden_layers=spec["layers"],
    num_attention_heads=spec["heads"],
    intermediate_size=spec["intermediate"],
    max_position_embeddings=spec["max_pos"],
    type_vocab_size=2,
    hidden_dropout_prob=spec["dropout"],
    attention_probs_dropout_prob=spec["dropout"],
  )


def _batch(spec: dict[str, Any]) -> dict[str, np.ndarray]:
  b, s, v = spec["batch"], spec["seq"], spec["vocab"]
  rs = np.random.RandomState(0)
  seg = np.zeros((b, s), np.int32)
  seg[:, s // 2 :] = 1
  return {
    "ids": rs.randint(1000, v, (b, s)).astype(np.int32),
    "seg": seg,
    "mask": np.ones((b, s), np.int32),
    "labels": rs.randint(1000, v, (b, s)).astype(np.int32),
    "w": (rs.rand(b, s) < 0.15).astype(np.float32),
    "nsp": rs.randint(0, 2, b).astype(np.int32),
  }


def flax_step(spec: dict[str, Any], info: dict[str, str]) -> tuple[Callable[[], float], float]:
  """HF's FlaxBertForPreTraining, jitted with params and optimizer state donated; returns
  (one step -> loss, compile seconds)."""
  import jax
  import jax.numpy as jnp
  import optax
  import transformers

  info["jax"] = jax.__version__
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[spec["dtype"]]
  model = transformers.FlaxBertForPreTraining(
    _hf_config(spec), input_shape=(1, spec["seq"]), seed=0, dtype=dtype
  )

  def decays(tree):
    return jax.tree_util.tree_map_with_path(
      lambda p, _: str(getattr(p[-1], "key", p[-1])) not in ("bias", "scale"), tree
    )

  tx = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=decays)
  batch = jax.device_put(_batch(spec))

  def step(params, opt_state, batch, rng):
    rng, drng = jax.random.split(rng)

    def loss_fn(p):
      out = model(
        batch["ids"],
        attention_mask=batch["mask"],
        token_type_ids=batch["seg"],
        params=p,
        dropout_rng=drng,
        train=True,
      )
      ce = optax.softmax_cross_entropy_with_integer_labels(
        out.prediction_logits.astype(jnp.float32), batch["labels"]
      )
      mlm = jnp.sum(ce * batch["w"]) / jnp.maximum(jnp.sum(batch["w"]), 1.0)
      nsp_ce = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits.astype(jnp.float32), batch["nsp"]
      )
      return mlm + jnp.mean(nsp_ce)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, rng

  carry = [model.params, tx.init(model.params), jax.random.PRNGKey(1)]
  t0 = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(*carry[:2], batch, carry[2]).compile()
  compile_s = time.perf_counter() - t0

  def run() -> float:
    carry[0], carry[1], loss, carry[2] = compiled(carry[0], carry[1], batch, carry[2])
    jax.block_until_ready((carry[0], loss))
    return float(loss)

  return run, compile_s


def _torch_pretraining(spec: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray]]:
  """BertForPreTraining and its forward's arguments (labels included), as arrays."""
  import transformers

  a = _batch(spec)
  inputs = {
    "input_ids": a["ids"],
    "attention_mask": a["mask"],
    "token_type_ids": a["seg"],
    "labels": np.where(a["w"] > 0, a["labels"], -100),  # HF's "ignore"
    "next_sentence_label": a["nsp"],
  }
  return transformers.BertForPreTraining(_hf_config(spec)), inputs


# `batches.pair_batch`'s fields -> BertForSequenceClassification's arguments.
_HF_ARGS = {
  "input_ids": "input_ids",
  "input_mask": "attention_mask",
  "segment_ids": "token_type_ids",
  "label": "labels",
}


def _torch_finetuning(spec: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray]]:
  """BertForSequenceClassification (SDPA attention) and its forward's arguments: the arrays
  ours times."""
  import transformers

  config = _hf_config(spec, num_labels=spec["num_labels"], attn_implementation="sdpa")
  arrays = batches.pair_batch(spec["batch"], spec["seq"], spec["vocab"])
  inputs = {_HF_ARGS[k]: v for k, v in arrays.items()}
  return transformers.BertForSequenceClassification(config), inputs


def torch_step(spec: dict[str, Any], info: dict[str, str]) -> Callable[[], float]:
  """HF's PyTorch BertForPreTraining (or BertForSequenceClassification), eager or
  torch.compile'd, fp32 or bf16 autocast; returns one step -> loss."""
  import torch

  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  info["torch"] = torch.__version__
  finetune = spec.get("task") == "finetune"
  model, arrays = (_torch_finetuning if finetune else _torch_pretraining)(spec)
  model = model.float().train()
  inputs = {k: torch.from_numpy(v).long() for k, v in arrays.items()}
  info["attn_implementation"] = str(model.config._attn_implementation)
  params = list(model.named_parameters())
  no_decay = [p for n, p in params if n.endswith("bias") or "LayerNorm" in n]
  decay = [p for n, p in params if not (n.endswith("bias") or "LayerNorm" in n)]
  opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
    lr=1e-4,
    eps=1e-6,
  )
  # Fine-tuning's schedule (10% warmup, then linear decay) stepped after each update, as the
  # recipe runs it (the pretraining step keeps a constant lr).
  total, warmup = 1_000_000, 100_000
  sched = finetune and torch.optim.lr_scheduler.LambdaLR(
    opt, lambda k: k / warmup if k < warmup else (total - k) / (total - warmup)
  )
  fwd = torch.compile(model) if spec["framework"] == "torch_compile" else model
  amp = spec["dtype"] == "bfloat16"

  def run() -> float:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=amp):
      out = fwd(**inputs)
    out.loss.backward()
    if finetune:
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if sched:
      sched.step()
    return float(out.loss.detach())

  return run


def measure(spec: dict[str, Any]) -> dict[str, Any]:
  """`spec['warmup']` untimed steps, then `spec['steps']` timed ones (or, with
  `spec['serve']`, the ones the lockstep parent asks for); returns the peer's record body."""
  import transformers

  info = {"transformers": transformers.__version__}
  compile_s = 0.0
  if spec["framework"] == "hf_flax":
    run, compile_s = flax_step(spec, info)
  else:
    run = torch_step(spec, info)
  losses, warm = [], []
  for _ in range(max(1, spec["warmup"])):
    t0 = time.perf_counter()
    losses.append(run())
    warm.append(time.perf_counter() - t0)
  load = host.load_average()

  def timed() -> float:
    t0 = time.perf_counter()
    losses.append(run())
    return time.perf_counter() - t0

  if spec.get("serve"):
    times = protocol.serve(timed)
  else:
    times = [timed() for _ in range(spec["steps"])]
  if spec["framework"] == "torch_compile" and times:  # it compiles inside its first call
    compile_s = max(0.0, warm[0] - sorted(times)[len(times) // 2])
  return {
    "step_s": times,
    "warmup_s": sum(warm),
    "compile_s": compile_s,
    "losses": losses,
    "peak_rss_gb": host.peak_rss_gb(),
    "load_avg": load,
    "versions": info,
  }


if __name__ == "__main__":
  protocol.print_result(measure(json.loads(sys.argv[1])))
