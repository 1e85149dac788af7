"""Shared by the lab tier's benchmark tests (test_benchmark*.py): paths, the peer interpreter, plans
and a stand-in step for the GPU comparison's workers."""

import json
import os
import pathlib
import re
import sys
import time

import jax
import jax.numpy as jnp

from bert_jax import model_config
from bert_jax.benchmark import (
  gpu_ours,
  peers,
  protocol,
  step,
)

PACKAGE = pathlib.Path(step.__file__).parent
REPO = PACKAGE.parents[1]
DEVICE_RUN = REPO / "tools" / "gpu" / "device_run.sh"
RUNS = REPO / "docs" / "gpu-runs" / "2026-11-28-h200"


def _peer_python() -> str | None:
  """An interpreter with torch and transformers: $BERT_JAX_PEER_PYTHON, or this one."""
  python = os.environ.get("BERT_JAX_PEER_PYTHON", sys.executable)
  return python if peers.peer_available(python)["torch"] else None


def _plan(i, role, variant=None, est=0.05, size="tiny", seq=16, task="pretrain"):
  return dict(id=f"ours{i}", side="ours", impl="bert_jax", role=role, priority=i, task=task,
              size=size, seq=seq, batch=2, variant=variant or {}, est_compile_s=est,
              est_step_s=0.001, est_mem=seq)  # fmt: skip


def _stand_in_prepare(plan, delay_s=0.0):
  """A tiny step in place of BERT's (a matmul and an update), prepared as `step.prepare` does:
  lowered against an abstract state, its init lowered beside it; other variants go to the
  real `prepare_plan` (whose bad fields fail before any compile)."""
  fields, _ = gpu_ours.split_variant(plan["variant"])
  if fields:
    return gpu_ours.prepare_plan(plan, delay_s)
  time.sleep(delay_s)
  n = plan["seq"]
  init = jax.jit(lambda r: {"w": jax.random.normal(r, (n, n))})
  abstract = jax.eval_shape(init, jax.random.key(0))

  def step_fn(state, batch, rng):
    loss = jnp.mean((batch @ state["w"]) ** 2)
    return {"w": state["w"] * 0.99}, {"loss": loss}

  t0 = time.perf_counter()
  lowered = jax.jit(step_fn, donate_argnums=0).lower(abstract, jnp.ones((2, n)), 0)
  lower_s = time.perf_counter() - t0
  cfg = model_config.config_for_size("tiny")
  return step.Prepared(
    lowered, init.lower(jax.random.key(0)), jnp.ones((2, n)), 0, jax.random.key(0), cfg, lower_s
  )


def _records(out: str) -> list[dict]:
  return [json.loads(x[len(protocol.RECORD_MARK) :]) for x in out.splitlines()
          if x.startswith(protocol.RECORD_MARK)]  # fmt: skip


def _device_run_limits() -> tuple[float, float]:
  """(the benchmark's --deadline, its hard timeout) in tools/gpu/device_run.sh."""
  text = DEVICE_RUN.read_text()
  (deadline,) = re.findall(r"--deadline=(\d+)", text)
  (timeout,) = re.findall(r'timeout (\d+) "\$PYTHON" -m bert_jax.benchmark --gpu', text)
  return float(deadline), float(timeout)


def _jsonl(path) -> list[dict]:
  return [json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if x.strip()]
