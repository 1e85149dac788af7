"""Our pretraining step as the benchmark times it: the trainer's own jitted train step on a
synthetic batch.

The step is `train.jit_train_step` on the state `train.create_state` makes (the same sharded
init of `train.state_init_fn`), built from the trainer's config (`config_lib.base_config(size)`)
exactly as `train.train_and_evaluate` builds it, on one device: state donated, on-device
masking included, on a full-length batch reused every step. `prepare` lowers it against the
abstract state, `compile_step` compiles it and the init (the GPU suite compiles several in
threads, then makes each state only to time it); `build_step` does both and makes the state.
The init depends only on the shapes of the parameters and the optimizer's state, so a process
that builds several steps of one model (variants of a shape; Large at 128 and 512 tokens)
compiles it once: the first build's compile serves the others (`Step.init_shared`). What is
measured of it is `measure.py`'s.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import threading
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import config_lib, masking, model_config, train
from bert_jax import sharding as sh
from bert_jax.benchmark import batches, sizes
from bert_jax.runtime import compile_cache
from bert_jax.tokenizers import tokenizer as tokenizer_lib

# Compiled state initialisers of this process by their program's text (a future while the
# first build compiles it: a build in another thread waits for it instead of compiling it too).
_INITS: dict[str, concurrent.futures.Future] = {}
_INITS_LOCK = threading.Lock()

# The two kernel settings of the model (`--variants=kernels=xla` times the stock XLA path).
# Without a variant the benchmark times the trainer's default ('auto': the CPU kernels on the
# CPU backend, stock XLA ops elsewhere).
FAST: dict[str, Any] = {"kernels": "cpu"}
PLAIN: dict[str, Any] = {"kernels": "xla"}

MAX_PREDICTIONS = sizes.MAX_PREDICTIONS
max_predictions = sizes.max_predictions


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
  """A compiled train step with its state (None until `fresh_state`), ready to be called."""

  compiled: Any
  state: Any
  batch: Any
  rng: Any
  cfg: model_config.BertConfig
  lower_s: float
  compile_s: float
  # Whether JAX's persistent compilation cache answered the compile (None: cache off).
  cache_hit: bool | None = None
  init: Any = None  # the compiled state initialiser: init(init_rng) -> a fresh train state
  init_rng: Any = None
  init_compile_s: float = 0.0
  # Whether another build of this process compiled the init (init_compile_s: the wait for it).
  init_shared: bool = False
  # Lowering, then the step's and the init's compiles side by side: the cold build's wall time.
  build_s: float = 0.0

  def fresh_state(self) -> Any:
    """A freshly initialised train state on the device (the compiled init, run now)."""
    return self.init(self.init_rng)


@dataclasses.dataclass
class Prepared:
  """A train step and its state initialiser, lowered against the abstract state (nothing has
  run on the device but the batch's transfer): `compile_step` makes it a Step."""

  lowered: Any
  init_lowered: Any
  batch: Any
  rng: Any
  init_rng: Any
  cfg: model_config.BertConfig
  lower_s: float


def prepare(config: ml_collections.ConfigDict, tables: Any = None) -> Prepared:
  """`train.jit_train_step` lowered against `train.abstract_state` (shapes and shardings, no
  arrays), and the state's sharded initialiser (`train.create_state`'s) lowered too, for a
  synthetic batch on one device. The init runs only when a state is asked for, so a GPU
  session can compile every step before any of them holds device memory."""
  tables = tables or _default_tables()
  mesh = sh.make_mesh(tuple(config.mesh.shape), devices=jax.devices()[:1])
  rules = sh.rules_from_config(config.mesh.rules)
  # The kernels the trainer would run on this device ('auto' -> 'cpu' on the CPU backend).
  _, model, tx, obj = train.model_and_optimizer(config, mesh.devices.flat[0].platform)
  cfg = model.cfg
  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  state_sh, abstract = train.abstract_state(config, model, tx, mesh, rules, init_rng)
  host_batch = synthetic_batch(config.data.batch_size, config.data.max_seq_length, cfg.vocab_size)
  batch = sh.to_global(host_batch, mesh)
  with sh.mesh_context(mesh, rules):
    fn = train.jit_train_step(model, tx, obj, tables, config.opt.grad_accum_steps, mesh, state_sh)
    t0 = time.perf_counter()
    lowered = fn.lower(abstract, batch, step_rng)
    lower_s = time.perf_counter() - t0
    init = sh.sharded_init(train.state_init_fn(config, model, tx), state_sh).lower(init_rng)
  return Prepared(lowered, init, batch, step_rng, init_rng, cfg, lower_s)


def compile_step(
  p: Prepared, compiler_options: dict[str, Any] | None = None, materialize: bool = True
) -> Step:
  """Compiles a prepared step (with XLA `compiler_options`, e.g. {"xla_gpu_autotune_level": 0},
  for this executable only) and, in a thread beside it, its initialiser, as the trainer does
  (`sharding.compile_ahead`); with `materialize`, runs the init too. XLA's compile releases
  the GIL: threads can run several."""

  def init_compile() -> tuple[Any, bool, float]:
    t = time.perf_counter()
    return (*compiled_init(p.init_lowered), time.perf_counter() - t)

  hits = compile_cache.thread_hits()
  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="init_compile") as pool:
    init_future = pool.submit(init_compile)
    compiled = p.lowered.compile(compiler_options=compiler_options or None)
    compile_s = time.perf_counter() - t0
    hit = compile_cache.thread_hits() > hits if compile_cache.active_dir() else None
    init, shared, init_s = init_future.result()
  st = Step(compiled, None, p.batch, p.rng, p.cfg, p.lower_s, compile_s, hit, init, p.init_rng)
  st.init_compile_s, st.init_shared = init_s, shared
  st.build_s = p.lower_s + time.perf_counter() - t0
  if materialize:
    st.state = st.fresh_state()
  return st


def compiled_init(lowered: Any) -> tuple[Any, bool]:
  """A lowered state initialiser compiled, once per program in this process: (the
  executable, whether an earlier build compiled it). Equal programs give equal states."""
  key = hashlib.sha256(lowered.as_text().encode()).hexdigest()
  with _INITS_LOCK:
    future = _INITS.get(key)
    shared = future is not None
    if not shared:
      future = _INITS[key] = concurrent.futures.Future()
  if not shared:
    try:
      future.set_result(lowered.compile())
    except BaseException as e:
      with _INITS_LOCK:
        del _INITS[key]  # a later build tries again
      future.set_exception(e)
      raise
  return future.result(), shared


def build_step(config: ml_collections.ConfigDict, tables: Any = None) -> Step:
  """`train.jit_train_step` on `train.create_state`'s state (made by the same sharded init),
  lowered and compiled for a synthetic batch on one device."""
  return compile_step(prepare(config, tables))


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
