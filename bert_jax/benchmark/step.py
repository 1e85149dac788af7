"""Our measurement: the trainer's own jitted train step, timed on a synthetic batch.

The step is `train.jit_train_step` on state from `train.create_state`, built from the
trainer's config (`config_lib.base_config(size)`) exactly as `train.train_and_evaluate` builds
it, on one device: state donated, on-device masking included. A measurement is the median time
of `steps` timed steps after `warmup` untimed ones (the first one compiles), on a full-length
batch reused every step. MFU divides the model FLOPs (`model.train_flops_per_token`: attention
included, the MLM head at the `max_predictions` gathered positions, the pruned last layer at
the positions it computes) by a matmul peak measured in the same process, before and after the
timed steps (the higher one is kept).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import config_lib, masking, train
from bert_jax import input_pipeline as pipeline
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax import tokenizer as tokenizer_lib
from bert_jax.benchmark import batches, host, memory, protocol, sizes, tables

# The two kernel settings of the model (`--variants=kernels=xla` times the stock XLA path).
# Without a variant the benchmark times the trainer's default ('auto': the CPU kernels on the
# CPU backend, stock XLA ops elsewhere).
FAST: dict[str, Any] = {"kernels": "cpu"}
PLAIN: dict[str, Any] = {"kernels": "xla"}

# Predicted positions per sequence by length (the original BERT's two phases).
MAX_PREDICTIONS = {128: 20, 512: 80}


def max_predictions(seq: int) -> int:
  """Masked positions per sequence of length `seq`."""
  return MAX_PREDICTIONS.get(seq, max(1, round(0.15 * seq)))


def synthetic_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A full-length NSP-style host batch ([CLS] A [SEP] B [SEP], no padding), as the input
  pipeline yields it (masking happens on device, inside the step)."""
  arrays = batches.pair_batch(batch, seq, vocab, seed)
  nsp = arrays.pop("label")
  return {
    **arrays,
    "next_sentence_label": nsp,
    "example_id": np.arange(batch, dtype=np.int32),
    "epoch": np.zeros(batch, np.int32),
  }


def bench_config(
  size: str, seq: int, batch: int, dtype: str, overrides: dict[str, Any]
) -> ml_collections.ConfigDict:
  """The trainer's config for a benchmark size (`sizes.SIZES`) on one device, with model-field
  overrides."""
  c = config_lib.base_config()
  c.model.update(sizes.size_fields(size))  # only the model fields depend on the size
  c.data.batch_size = batch
  c.data.max_seq_length = seq
  c.masking.max_predictions = max_predictions(seq)
  c.model.dtype = dtype
  c.opt.total_steps = 1_000_000
  c.mesh.shape = (1, 1, 1)
  set_model_fields(c, overrides)
  return c


def set_model_fields(config: ml_collections.ConfigDict, overrides: dict[str, Any]) -> None:
  """`config.model` with a variant's fields set (cast to each field's type)."""
  for k, v in overrides.items():
    if k not in config.model:
      raise ValueError(f"--variants key {k!r} is not a BertConfig field")
    config.model[k] = type(config.model[k])(v) if config.model[k] is not None else v


@functools.cache
def _default_tables() -> masking.MaskingTables:
  path = tokenizer_lib.default_vocab_path()
  return masking.tables_from_tokenizer(tokenizer_lib.load_tokenizer(path))


@dataclasses.dataclass
class Step:
  """A compiled train step with its state, ready to be called."""

  compiled: Any
  state: Any
  batch: Any
  rng: Any
  cfg: model_lib.BertConfig
  lower_s: float
  compile_s: float


def build_step(config: ml_collections.ConfigDict, tables: Any = None) -> Step:
  """`train.jit_train_step` on `train.create_state`'s state, lowered and compiled for a
  synthetic batch on one device."""
  tables = tables or _default_tables()
  mesh = sh.make_mesh(tuple(config.mesh.shape), devices=jax.devices()[:1])
  rules = sh.rules_from_config(config.mesh.rules)
  # The kernels the trainer would run on this device ('auto' -> 'cpu' on the CPU backend).
  _, model, tx, obj = train.model_and_optimizer(config, mesh.devices.flat[0].platform)
  cfg = model.cfg
  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  state, state_sh, _ = train.create_state(config, model, tx, mesh, rules, init_rng)
  host_batch = synthetic_batch(config.data.batch_size, config.data.max_seq_length, cfg.vocab_size)
  batch = pipeline.to_global(host_batch, mesh)
  with sh.mesh_context(mesh, rules):
    fn = train.jit_train_step(model, tx, obj, tables, config.opt.grad_accum_steps, mesh, state_sh)
    t0 = time.perf_counter()
    lowered = fn.lower(state, batch, step_rng)
    lower_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  compiled = lowered.compile()
  return Step(compiled, state, batch, step_rng, cfg, lower_s, time.perf_counter() - t0)


def run_steps(step: Step, n: int, timed: bool = True) -> tuple[list[float], list[float]]:
  """n steps; returns (per-step seconds, losses). Syncs on each step only to time it."""
  times, losses = [], []
  for _ in range(n):
    t0 = time.perf_counter()
    step.state, metrics = step.compiled(step.state, step.batch, step.rng)
    if timed:
      jax.block_until_ready((step.state, metrics))
      times.append(time.perf_counter() - t0)
    losses.append(metrics["loss"])
  return times, [float(x) for x in jax.device_get(losses)]


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
    from bert_jax.benchmark import finetune_step

    step = finetune_step.build_step(finetune_step.bench_config(size, seq, batch, dtype, variant))
    flops = sizes.finetune_flops_per_token(step.cfg, seq, finetune_step.NUM_LABELS)
  elif task == "pretrain":
    step = build_step(bench_config(size, seq, batch, dtype, variant))
    flops = model_lib.train_flops_per_token(step.cfg, seq, max_predictions(seq))
  else:
    raise ValueError(f"--task must be pretrain or finetune, not {task!r}")
  t0 = time.perf_counter()
  _, warm_losses = run_steps(step, max(1, warmup))
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
      t, loss = run_steps(step, 1)
      losses.extend(loss)
      return t[0]

    times = protocol.serve(one)
    n_run = len(losses)  # the settle steps fault too
  else:
    times, losses = run_steps(step, steps)
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
  return [sys.executable, "-m", "bert_jax.benchmark", "--worker=" + json.dumps(spec)]


def measure_ours_isolated(spec: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
  """`measure_ours(**spec)` in a fresh interpreter: its own compile time, peak RSS and matmul
  peak."""
  return protocol.run_once(ours_argv(spec), timeout)
