"""Our fine-tuning measurement: the fine-tuning engine's train step
(`finetune.seed.make_train_step` on `finetune.seed.state_init_fn`'s state, jitted as
`finetune.seed.run_seed` jits it: state donated, on one device) for 2-way sequence
classification, with configs/finetune.py's recipe (`bert_jax.configs.finetune`: AdamW, warmup
+ linear decay, clipping, dropout 0.1), timed on `batches.pair_batch`: the arrays the PyTorch
peer times. The model is a fresh one of a benchmark size (`sizes.SIZES`): a step costs the
same whatever the weights.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from bert_jax import backends, model_config, optim
from bert_jax import sharding as sh
from bert_jax import tasks as tasks_lib
from bert_jax.benchmark import batches, sizes, step
from bert_jax.finetune import seed as finetune_seed

NUM_LABELS = 2
# The schedule's length: warmup and decay as a run of this many steps would have them (a timed
# step costs the same at any point of the schedule).
TOTAL_STEPS = 1_000_000


def bench_config(
  size: str, seq: int, batch: int, dtype: str, overrides: dict[str, Any]
) -> ml_collections.ConfigDict:
  """configs/finetune.py's config (the recipe) for a benchmark size on one device, with
  model-field overrides."""
  c = recipe_module().get_config("rotten_tomatoes")
  c.model.update(sizes.size_fields(size))
  c.model.dtype = dtype
  c.data.batch_size = batch
  c.data.max_seq_length = seq
  c.mesh.shape = (1, 1, 1)
  step.set_model_fields(c, overrides)
  return c


def recipe_module():
  """`bert_jax.configs.finetune` (configs/finetune.py, installed as bert_jax.configs)."""
  try:
    return importlib.import_module("bert_jax.configs.finetune")
  except ModuleNotFoundError as e:
    raise ImportError(
      "bert_jax.configs is not importable: install the checkout (pip install -e .) "
      "rather than putting it on PYTHONPATH"
    ) from e


def host_batch(config: ml_collections.ConfigDict, vocab: int) -> dict[str, np.ndarray]:
  """The engine's batch fields for `batches.pair_batch`: every row real (weight 1)."""
  arrays = batches.pair_batch(config.data.batch_size, config.data.max_seq_length, vocab)
  return {**arrays, "weight": np.ones(config.data.batch_size, np.float32)}


class Engine(NamedTuple):
  """The fine-tuning engine's pieces for a benchmark config."""

  cfg: model_config.BertConfig
  init_fn: Callable  # rng -> boxed train state
  train_step: Callable  # (state, batch, rng) -> (state, metrics)


def engine(config: ml_collections.ConfigDict) -> Engine:
  """The engine's model (kernels resolved for the first device), optimizer, state init and
  train step for 2-way sequence classification, as `finetune.seed.run_seed` builds them."""
  cfg = model_config.BertConfig(
    **{k: v for k, v in config.model.to_dict().items() if k != "causal"}
  )
  task = tasks_lib.Task("benchmark", "classification", ("0", "1"), ("accuracy",))
  model = task.model(backends.resolve_kernels(cfg, jax.devices()[0].platform))
  steps_per_epoch = TOTAL_STEPS // int(config.opt.epochs)
  tx = optim.make_optimizer(finetune_seed.optimizer_config(config, steps_per_epoch))
  init_fn = finetune_seed.state_init_fn(model, tx, min(8, cfg.max_position_embeddings))
  train_step = finetune_seed.make_train_step(model, tx, task, config.opt.grad_accum_steps)
  return Engine(model.cfg, init_fn, train_step)


def prepare(config: ml_collections.ConfigDict) -> step.Prepared:
  """The engine's train step, lowered for the benchmark batch on one device against the
  abstract state (its sharded init lowered beside it, not run); its metrics gain "loss" (the
  batch's mean loss) for the benchmark's loss log."""
  mesh = sh.make_mesh(tuple(config.mesh.shape), devices=jax.devices()[:1])
  rules = sh.rules_from_config(config.mesh.rules)
  cfg, init_fn, train_step = engine(config)
  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  state_sh, abstract = sh.abstract_sharded(init_fn, mesh, rules, init_rng)

  batch = sh.to_global(host_batch(config, cfg.vocab_size), mesh)
  with sh.mesh_context(mesh, rules):
    fn = sh.jit_step(train_step, mesh, state_sh)
    t0 = time.perf_counter()
    lowered = fn.lower(abstract, batch, step_rng)
    lower_s = time.perf_counter() - t0
    init = sh.sharded_init(init_fn, state_sh).lower(init_rng)
  return step.Prepared(lowered, init, batch, step_rng, init_rng, cfg, lower_s)


def build_step(config: ml_collections.ConfigDict) -> step.Step:
  """`prepare`, compiled, with its state made."""
  return step.compile_step(prepare(config))
