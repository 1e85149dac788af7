"""Our measurement: the pretraining step (`step.py`) or the fine-tuning step
(`finetune_step.py`), timed in this process or in a fresh interpreter.

A measurement is the median time of `steps` timed steps after `warmup` untimed ones (the first
one compiles), on a full-length batch reused every step. MFU divides the model FLOPs
(`model.train_flops_per_token`: attention included, the MLM head at the `max_predictions`
gathered positions, the pruned last layer at the positions it computes) by a matmul peak
measured in the same process, before and after the timed steps (the higher one is kept).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import jax

from bert_jax import model as model_lib
from bert_jax.benchmark import finetune_step, host, memory, protocol, sizes, tables
from bert_jax.benchmark import step as step_lib
from bert_jax.runtime import compile_cache


def measure_ours(
  size: str,
  seq: int,
  batch: int,
  dtype: str,
  steps: int,
  warmup: int,
  variant: dict[str, Any] | None = None,
  peak: bool = True,
  memory_stats: bool = False,
  serve: bool = False,
  task: str = "pretrain",
) -> dict[str, Any]:
  """One measurement of our train step, in this process: the pretraining step, or with
  `task="finetune"` the fine-tuning engine's sequence-classification step (`finetune_step`).
  With `serve`, the timed steps are the ones a lockstep parent asks for (`protocol.serve`),
  not `steps`; with `memory_stats`, the record adds XLA's buffer accounting
  (`memory.memory_record`)."""
  variant = dict(variant or {})
  if task == "finetune":
    step = finetune_step.build_step(finetune_step.bench_config(size, seq, batch, dtype, variant))
    flops = sizes.finetune_flops_per_token(step.cfg, seq, finetune_step.NUM_LABELS)
  elif task == "pretrain":
    step = step_lib.build_step(step_lib.bench_config(size, seq, batch, dtype, variant))
    flops = model_lib.train_flops_per_token(step.cfg, seq, sizes.max_predictions(seq))
  else:
    raise ValueError(f"--task must be pretrain or finetune, not {task!r}")
  t0 = time.perf_counter()
  _, warm_losses = step_lib.run_steps(step, max(1, warmup))
  warmup_s = time.perf_counter() - t0
  # Measured before and after the timed steps, the higher kept: a transient slowdown of the
  # host cannot lower the MFU denominator.
  peak_dtypes = (["float32"] + ([dtype] if dtype != "float32" else [])) if peak else []
  peaks = {d: host.matmul_peak_gflops(d) for d in peak_dtypes}
  load = host.load_average()
  faults = host.minor_faults()
  if serve:
    losses: list[float] = []

    def one() -> float:
      t, loss = step_lib.run_steps(step, 1)
      losses.extend(loss)
      return t[0]

    times = protocol.serve(one)
    n_run = len(losses)  # the settle steps fault too
  else:
    times, losses = step_lib.run_steps(step, steps)
    n_run = steps
  faults = (host.minor_faults() - faults) / max(1, n_run)
  peaks = {d: max(g, host.matmul_peak_gflops(d)) for d, g in peaks.items()}
  med = statistics.median(times)
  rec = {
    "kind": "train_step",
    "task": task,
    "impl": "bert_jax",
    "size": size,
    "seq": seq,
    "batch": batch,
    "dtype": dtype,
    "variant": variant,
    "kernels": step.cfg.kernels,
    **tables.summarize_times(times),
    "step_s": times,
    "tokens_per_s": batch * seq / med,
    "examples_per_s": batch / med,
    "flops_per_token": flops,
    "gflops": flops * batch * seq / med / 1e9,
    "compile_s": step.lower_s + step.compile_s,
    "lower_s": step.lower_s,
    "compile_cache_hit": step.cache_hit,
    "warmup_s": warmup_s,
    "peak_rss_gb": host.peak_rss_gb(),
    "page_faults_per_step": faults,
    "glibc_tunables": host.STARTED_WITH_TUNABLES,
    "losses": warm_losses + losses,
    "load_avg": load,
    "jax": jax.__version__,
  }
  if memory_stats:
    rec.update(memory.memory_record(step.compiled, step.state["params"]))
    rec["peak_rss_ratio"] = rec["peak_rss_gb"] / rec["params_grads_adam_gb"]
  if peaks:
    rec["peak_gflops"] = peaks
    rec["mfu_fp32_peak"] = rec["gflops"] / peaks["float32"]
    rec["mfu"] = rec["gflops"] / peaks[dtype]
  return rec


def ours_argv(spec: dict[str, Any]) -> list[str]:
  """A fresh interpreter running `measure_ours(**spec)` (the CLI's `--worker`)."""
  argv = [sys.executable, "-m", "bert_jax.benchmark", "--worker=" + json.dumps(spec)]
  return argv + compile_cache.child_args()


def measure_ours_isolated(spec: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
  """`measure_ours(**spec)` in a fresh interpreter: its own compile time, peak RSS and matmul
  peak."""
  return protocol.run_once(ours_argv(spec), timeout)
