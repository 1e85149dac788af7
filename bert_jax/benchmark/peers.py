"""The peers: HuggingFace `FlaxBertForPreTraining` and PyTorch `BertForPreTraining` (eager and
torch.compile), timed on our shapes by `peer_worker.py` in a peer interpreter; for the
fine-tuning step (`task="finetune"`) PyTorch `BertForSequenceClassification` (2 labels, SDPA
attention), eager and torch.compile.

A peer is `framework:dtype`: hf_flax, torch or torch_compile; float32, or bfloat16 (autocast
for PyTorch). The peer interpreter (`--peer_python`) needs torch and transformers 4.x (and
jax, flax, optax for hf_flax), not bert_jax: it runs the worker file by path. The peers' MLM
head computes logits at every position, as HuggingFace does, and their FLOPs count it so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from typing import Any

from bert_jax import model as model_lib
from bert_jax.benchmark import host, protocol, sizes, tables

FRAMEWORKS = ("hf_flax", "torch", "torch_compile")
TASKS = ("pretrain", "finetune")
# The fine-tuning step is timed against transformers' PyTorch model only (HF Flax's
# sequence-classification model is not a peer).
FINETUNE_FRAMEWORKS = ("torch", "torch_compile")
FINETUNE_LABELS = 2
# Each peer in the precisions this CPU runs natively: bf16 only with AVX512-BF16 or AMX
# (emulated bf16 makes a PyTorch step many times slower than fp32).
PEERS_FP32 = ("hf_flax:float32", "torch:float32", "torch_compile:float32")
PEERS_BF16 = ("torch:bfloat16", "torch_compile:bfloat16")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_worker.py")


def default_peers(task: str = "pretrain") -> list[str]:
  """Every peer of `task` in fp32, and in bf16 where the CPU has bf16 instructions."""
  every = PEERS_FP32 + (PEERS_BF16 if host.cpu_has_bf16() else ())
  if task == "finetune":
    return [p for p in every if p.split(":")[0] in FINETUNE_FRAMEWORKS]
  return list(every)


def peer_available(python: str) -> dict[str, bool]:
  """Which peer frameworks `python` can run."""
  code = (
    "import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None "
    "for m in ('torch', 'transformers', 'jax', 'optax', 'flax')}))"
  )
  try:
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    mods = json.loads(out.stdout.strip().splitlines()[-1])
  except (OSError, subprocess.SubprocessError, ValueError, IndexError):
    return dict.fromkeys(FRAMEWORKS, False)
  flax_ok = False
  if mods["transformers"] and mods["jax"] and mods["flax"] and mods["optax"]:
    # transformers 5 dropped the Flax models.
    check = "import transformers; assert int(transformers.__version__.split('.')[0]) < 5"
    flax_ok = (
      subprocess.run([python, "-c", check], capture_output=True, timeout=300).returncode == 0
    )
  torch_ok = mods["torch"] and mods["transformers"]
  return {"hf_flax": flax_ok, "torch": torch_ok, "torch_compile": torch_ok}


def peer_spec(
  framework: str, dtype: str, size: str, seq: int, batch: int, task: str = "pretrain"
) -> dict[str, Any]:
  """The worker's spec: our model size's shapes, dropout 0.1, the step to time."""
  cfg = sizes.config_for_size(size)
  return {
    "task": task,
    "num_labels": FINETUNE_LABELS,
    "framework": framework,
    "dtype": dtype,
    "size": size,
    "batch": batch,
    "seq": seq,
    "layers": cfg.num_layers,
    "hidden": cfg.hidden_size,
    "heads": cfg.num_heads,
    "intermediate": cfg.intermediate_size,
    "vocab": cfg.vocab_size,
    "max_pos": cfg.max_position_embeddings,
    "dropout": 0.1,
  }


def peer_argv(python: str, spec: dict[str, Any]) -> list[str]:
  """The peer worker, run by path in `python`."""
  return [python, WORKER, json.dumps(spec)]


def peer_record(spec: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
  """A peer's train-step record (the same keys as ours) from its worker's output."""
  times = out["step_s"]
  med = statistics.median(times)
  seq, batch = spec["seq"], spec["batch"]
  cfg = sizes.config_for_size(spec["size"])
  if spec.get("task") == "finetune":
    flops = sizes.finetune_flops_per_token(cfg, seq, spec["num_labels"])
  else:  # HF computes the MLM head at every position.
    flops = model_lib.train_flops_per_token(cfg, seq, seq)
  return {
    "kind": "train_step",
    "task": spec.get("task", "pretrain"),
    "impl": spec["framework"],
    "size": spec["size"],
    "seq": seq,
    "batch": batch,
    "dtype": spec["dtype"],
    "variant": {},
    **tables.summarize_times(times),
    "tokens_per_s": batch * seq / med,
    "examples_per_s": batch / med,
    "flops_per_token": flops,
    "gflops": flops * batch * seq / med / 1e9,
    **out,
  }


def measure_peer(
  python: str,
  framework: str,
  dtype: str,
  size: str,
  seq: int,
  batch: int,
  steps: int,
  warmup: int,
  timeout: float = 3600,
  task: str = "pretrain",
) -> dict[str, Any]:
  """One peer measurement in a fresh `python` process."""
  spec = peer_spec(framework, dtype, size, seq, batch, task)
  spec.update(steps=steps, warmup=warmup)
  return peer_record(spec, protocol.run_once(peer_argv(python, spec), timeout))
