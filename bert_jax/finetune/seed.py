"""One fine-tuning seed: train (resuming its checkpoint), evaluate dev every `eval_every` steps,
keep the best dev point (`best/`) and score test there; `seed_<k>/result.json` when done.

`SeedRun` is what every seed of a point shares, taken from the config once (`seed_run`); seed
k differs only in its random numbers (`SeedRun.base_seed + k`: head init, data order, dropout).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import backends, loop, optim, params_tree
from bert_jax import sharding as sh
from bert_jax import tasks as tasks_lib
from bert_jax.finetune.data import Split, Splits
from bert_jax.finetune.inputs import Prepared
from bert_jax.model_config import BertConfig
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.runtime import files
from bert_jax.tasks import batches as batches_lib
from bert_jax.tasks import kinds, squad

SEED_RESULT = "result.json"
BEST = "best"


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How long every seed of a point trains: `epochs` (opt.epochs, or more when they would be
  fewer than opt.min_steps steps) of `per_epoch` steps, dev every `eval_every` steps."""

  per_epoch: int
  epochs: int
  eval_every: int

  @property
  def total_steps(self) -> int:
    return self.epochs * self.per_epoch


def schedule(config: ml_collections.ConfigDict, train_rows: int) -> Schedule:
  """A small training set at the paper's recipe is a handful of steps (60 rows, batch 32, 3
  epochs: 6) and learns nothing: epochs are raised until a run takes opt.min_steps steps, and
  dev is then evaluated as often as opt.epochs asked for (every few epochs)."""
  per_epoch = math.ceil(train_rows / config.data.batch_size)
  epochs = max(int(config.opt.epochs), math.ceil(config.opt.get("min_steps", 0) / per_epoch))
  every_epochs = math.ceil(epochs / config.opt.epochs)
  return Schedule(per_epoch, epochs, config.eval.every_steps or every_epochs * per_epoch)


def optimizer_config(
  config: ml_collections.ConfigDict, steps_per_epoch: int, epochs: int | None = None
) -> Any:
  """config.opt with total_steps = epochs (default opt.epochs; a schedule's) x steps per epoch
  and warmup_steps from warmup_fraction (the paper's 10%)."""
  opt = ml_collections.ConfigDict(config.opt.to_dict())
  opt.total_steps = int(epochs or config.opt.epochs) * steps_per_epoch
  opt.warmup_steps = int(round(config.opt.warmup_fraction * opt.total_steps))
  return opt


# ----------------------------------------------------------------------------- steps


def state_init_fn(model, tx, length: int = 8):
  """rng -> fine-tuning train state {step, params, opt_state} with LogicallyPartitioned leaves
  (`sharding.init_sharded` materialises it sharded)."""

  def init(rng):
    shape = (1, 2, length) if kinds.KINDS[model.kind].choices else (1, length)
    ids = jnp.zeros(shape, jnp.int32)
    args = model.example_inputs(length) if hasattr(model, "example_inputs") else None
    params = model.init({"params": rng}, *(args or (ids, ids, jnp.ones_like(ids))))["params"]
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

  return init


def make_train_step(model, tx, task: tasks_lib.Task, grad_accum_steps: int = 1):
  """`train_step(state, batch, rng) -> (state, metrics)`: the trainer's accumulation and
  guarded update (optim) around the task's loss; metrics as `loop.Job` reads them."""

  def train_step(state, batch, rng):
    rng = jax.random.fold_in(rng, state["step"])
    total = jnp.maximum(task.count(batch), 1.0)

    def loss_fn(params, micro, micro_rng):
      logits = model.apply(
        {"params": params},
        *(micro[k] for k in batches_lib.model_inputs(model)),
        deterministic=False,
        rngs={"dropout": micro_rng},
      )
      loss_sum, _ = task.losses(logits, micro)
      return loss_sum / total, loss_sum

    grad_fn = jax.grad(loss_fn, has_aux=True)
    grads, loss_sum = optim.accumulate_grads(grad_fn, state["params"], batch, rng, grad_accum_steps)
    new_state, update_metrics = optim.apply_update(state, grads, tx)
    return new_state, {"loss": loss_sum / total, **update_metrics}

  return train_step


def make_eval_step(model, task: tasks_lib.Task):
  def eval_step(params, batch):
    inputs = (batch[k] for k in batches_lib.model_inputs(model))
    logits = model.apply({"params": params}, *inputs, deterministic=True)
    loss_sum, count = task.losses(logits, batch)
    return {**task.predict(logits), "row": batch["row"], "loss_sum": loss_sum, "count": count}

  return eval_step


def evaluate(
  p_eval,
  params,
  task: tasks_lib.Task,
  split: Split,
  mesh,
  batch_size: int,
  bucket_lengths: tuple[int, ...],
  pad_id: int,
  stop: Callable[[], bool] | None = None,
) -> tuple[dict[str, float], dict[str, list]]:
  """(the task's metrics on a whole split plus its mean loss, each row's predictions); an
  unlabelled split has no metrics ({}). `stop()` is asked before each batch (on every process
  alike): True abandons the eval (`loop.EvalInterrupted`)."""
  rows = split.rows
  preds: dict[str, list] = {}
  loss_sum = count = 0.0
  for batch in batches_lib.eval_batches(rows, batch_size, bucket_lengths, pad_id):
    if stop is not None and stop():
      raise loop.EvalInterrupted()
    local = batches_lib.host_slice(batch)  # this process's rows
    out = jax.device_get(p_eval(params, sh.to_global(local, mesh)))
    loss_sum += float(out.pop("loss_sum"))
    count += float(out.pop("count"))
    for j, r in enumerate(out.pop("row")):
      if r < 0:
        continue
      n = rows[r]["input_ids"].shape[-1]
      for k, v in out.items():
        preds.setdefault(k, [None] * len(rows))[r] = (
          v[j][:n] if v.ndim > 1 and not task.spec.choices else v[j]
        )
  if split.state == "unlabelled":
    return {}, preds
  result = task.score(preds, rows, split.qa)
  if count:
    result["loss"] = loss_sum / count
  return result, preds


# ----------------------------------------------------------------------------- a seed


@dataclasses.dataclass(frozen=True)
class SeedRun:
  """What every seed of a point trains with, built once for all of them: the prepared inputs,
  the schedule, the recipe's values (a seed reads no config) and the jitted init, train and
  eval steps (traced and compiled once per point, not per seed)."""

  prep: Prepared
  workdir: str
  plan: Schedule
  seeds: int
  base_seed: int  # seed k uses base_seed + k
  batch_size: int
  eval_batch_size: int
  bucket_lengths: tuple[int, ...]
  nonfinite: str
  max_consecutive_skips: int
  log_every: int
  ckpt_keep: int
  async_save: bool
  config_json: dict[str, Any]  # the config as it ran, in each checkpoint's metadata
  best_info: dict[str, Any]  # best/'s task.json
  learning_rate: Callable[[int], Any]  # the schedule, for the log
  init: Callable[[Any], Any]  # rng -> the train state, materialised sharded
  abstract: Any  # the train state's shapes, dtypes and shardings (restores read into it)
  p_train: Callable[..., Any]  # (state, batch, rng) -> (state, metrics)
  p_eval: Callable[..., Any]  # (params, batch) -> per-row predictions, loss sum and count


def ran_config(config: ml_collections.ConfigDict, cfg: BertConfig) -> dict[str, Any]:
  """The config as JSON with config.model as it ran: a checkpoint's architecture replaces the
  size fields (config.json, results.json and the seeds' checkpoints record what ran)."""
  out = ckpt_lib.to_json(config.to_dict())
  out["model"] = ckpt_lib.to_json({k: getattr(cfg, k, v) for k, v in config.model.items()})
  return out


def seed_run(config: ml_collections.ConfigDict, workdir: str, prep: Prepared) -> SeedRun:
  """The config's values a seed needs and its jitted steps, once for every seed of the point."""
  task, mesh, rules = prep.task, prep.mesh, prep.rules
  # The recipe's values first (what a seed reads), then the model and its jitted steps.
  plan = schedule(config, len(prep.data["train"].rows))
  opt = optimizer_config(config, plan.per_epoch, plan.epochs)
  config_json = ran_config(config, prep.cfg)
  bucket_lengths = batches_lib.buckets(config)
  tx = optim.make_optimizer(opt)
  learning_rate = optim.learning_rate_schedule(opt)
  run_cfg = backends.resolve_kernels(prep.cfg, mesh.devices.flat[0].platform)
  model = prep.head.make_model(run_cfg, task)
  eval_step = make_eval_step(model, task)
  init_fn = state_init_fn(model, tx, min(8, prep.cfg.max_position_embeddings))
  train_step = make_train_step(model, tx, task, config.opt.grad_accum_steps)
  shardings, abstract = sh.abstract_sharded(init_fn, mesh, rules, jax.random.key(0))
  with sh.mesh_context(mesh, rules):
    p_train = sh.jit_step(train_step, mesh, shardings)
    p_eval = sh.jit_eval(eval_step, mesh, shardings["params"])
  # Called (and so traced) under the mesh and its rules: the activations' logical constraints
  # are in the steps' programs.
  p_train, p_eval = (sh.under_mesh(f, mesh, rules) for f in (p_train, p_eval))
  sharded_init = sh.sharded_init(init_fn, shardings)

  def init(rng):
    """The fresh train state, sharded, with the checkpoint's encoder placed in it."""
    with sh.mesh_context(mesh, rules):
      state = sharded_init(rng)
    if prep.init_params is not None and "bert" in abstract["params"]:
      placed = params_tree.place(prep.init_params, abstract["params"]["bert"])
      state = {**state, "params": {**state["params"], "bert": placed}}
    return state

  return SeedRun(
    prep=prep,
    workdir=workdir,
    plan=plan,
    seeds=config.seeds,
    base_seed=config.seed,
    batch_size=config.data.batch_size,
    eval_batch_size=config.data.eval_batch_size,
    bucket_lengths=bucket_lengths,
    nonfinite=config.opt.nonfinite,
    max_consecutive_skips=config.opt.max_consecutive_skips,
    log_every=config.log.every_steps,
    ckpt_keep=config.ckpt.keep,
    async_save=config.ckpt.async_save,
    config_json=config_json,
    best_info={
      "kind": task.kind,
      "labels": list(task.labels),
      "task": task.name,
      "max_seq_length": config.data.max_seq_length,
      "bilstm": bool(config.head.bilstm),
    },
    learning_rate=learning_rate,
    init=init,
    abstract=abstract,
    p_train=p_train,
    p_eval=p_eval,
  )


def more_epochs(run: SeedRun, epochs: int, min_steps: int) -> str:
  """The line that says a small training set trains more epochs than opt.epochs."""
  plan = run.plan
  return (
    f"{len(run.prep.data['train'].rows)} training rows at batch {run.batch_size} are "
    f"{plan.per_epoch} step{'s' if plan.per_epoch > 1 else ''} an epoch: {epochs} "
    f"epochs would be {epochs * plan.per_epoch} steps, fewer than "
    f"opt.min_steps={min_steps}, so each seed trains {plan.epochs} epochs "
    f"({plan.total_steps} steps), dev every {plan.eval_every} steps "
    "(--config.opt.min_steps=0 keeps opt.epochs)"
  )


def seed_label(k: int, seeds: int) -> str:
  """Seed k as every message names it: numbered from 0 as its seed_<k>/ directory, the
  results' seed lists and at_or_below ('seed 2 [0-4]': the third of seeds 0 to 4)."""
  return f"seed {k}" + (f" [0-{seeds - 1}]" if seeds > 1 else "")


def run_seed(run: SeedRun, k: int, preempt) -> dict[str, Any]:
  """Trains seed k (resuming its checkpoint), returns its result (also `seed_<k>/result.json`),
  or {"preempted": True} once a signal's checkpoint is saved."""
  prep, plan = run.prep, run.plan
  task, data, tokenizer, mesh = prep.task, prep.data, prep.tokenizer, prep.mesh
  seed_dir = os.path.join(run.workdir, f"seed_{k}")
  done = os.path.join(seed_dir, SEED_RESULT)
  if os.path.exists(done):
    return files.read_json(done, keys=("dev", "test"))
  os.makedirs(seed_dir, exist_ok=True)
  seed, label = run.base_seed + k, seed_label(k, run.seeds)
  init_rng, step_rng = jax.random.split(jax.random.key(seed))
  ckpt = ckpt_lib.Checkpointer(
    os.path.join(seed_dir, "checkpoints"),
    keep=run.ckpt_keep,
    every_steps=plan.eval_every,
    async_save=run.async_save,
  )
  restored = ckpt.restore_latest(run.abstract)
  best: dict[str, Any] = {"step": 0, "dev": None, "test": {}}
  window: dict[str, float] = {}

  def save(step: int, state: Any, window: dict[str, float]) -> None:
    meta = {"best": best, "config": run.config_json, "pending_metrics": window}
    ckpt.save(step, state, None, meta, force=True)

  if restored is not None:
    start_step, state, meta = restored
    best, window = meta["best"], meta.get("pending_metrics", {})
    loop.console(f"seed {k}: resumed at step {start_step}")
  else:
    start_step, state = 0, run.init(init_rng)
  logger = loop.MetricLogger(seed_dir, start_step)
  main = task.main_metric
  run_start = time.perf_counter()

  def evaluate_split(split: str, params: Any) -> tuple[dict[str, float], dict[str, list]]:
    return evaluate(
      run.p_eval,
      params,
      task,
      data[split],
      mesh,
      run.eval_batch_size,
      run.bucket_lengths,
      tokenizer.pad_id,
      preempt.interrupts,
    )

  def evaluate_and_select(step: int, state: Any) -> None:
    """Dev at this step; a new best dev point is kept (params dir) and scored on test (an
    unlabelled test split: its predictions are written). A signal during either eval
    abandons both before anything is written (the resumed run evaluates this step again)."""
    nonlocal best
    dev, _ = evaluate_split("dev", state["params"])
    new_best = best["dev"] is None or dev[main] > best["dev"][main]
    test, test_preds = {}, None
    if new_best and data["test"] is not None:
      if data["test"] is data["dev"]:  # the same rows: the dev scores are the test's
        test = dev
      else:
        test, test_preds = evaluate_split("test", state["params"])
    logger.write(step, "dev", dev)
    msg = f"dev @ {step}: {loop.format_metrics(dev)}"
    if new_best:
      best = {"step": step, "dev": dev, "test": test}
      if test:
        logger.write(step, "test", test)
      save_best(run, os.path.join(seed_dir, BEST), state["params"])
      write_predictions(seed_dir, data)
      if test_preds is not None and data["test"].state == "unlabelled":
        write_split_predictions(seed_dir, task, "test", data["test"], test_preds)
      msg += "  (best so far)"
    loop.console(msg)

  train_batches = batches_lib.train_batches(
    data["train"].rows, seed, run.batch_size, start_step, run.bucket_lengths, tokenizer.pad_id
  )
  job = loop.Job(
    step_fn=run.p_train,
    batches=map(batches_lib.host_slice, train_batches),
    preemption=preempt,
    mesh=mesh,
    rng=step_rng,
    total_steps=plan.total_steps,
    logger=logger,
    learning_rate=run.learning_rate,
    evaluate=evaluate_and_select,
    save=save,
    log_every=run.log_every,
    eval_every=plan.eval_every,
    ckpt_every=plan.eval_every,
    examples_per_step=run.batch_size,
    nonfinite=run.nonfinite,
    max_consecutive_skips=run.max_consecutive_skips,
    describe=lambda step, _: f"epoch {(step - 1) // plan.per_epoch + 1}/{plan.epochs}",
    label=label,
  )
  with loop.closing(ckpt, logger):
    result = loop.run(job, state, start_step, window)
  if result.preempted:
    return {"preempted": True}
  out = {
    "seed": seed,
    "best_step": best["step"],
    "best_epoch": math.ceil(best["step"] / plan.per_epoch),
    "dev": best["dev"],
    "test": best["test"],
    "train_seconds": round(time.perf_counter() - run_start, 1),
  }
  if jax.process_index() == 0:
    files.write_atomic(done, json.dumps(out, indent=2) + "\n")
  return out


def write_split_predictions(
  seed_dir: str, task: tasks_lib.Task, split: str, data: Split, preds: dict[str, list]
) -> None:
  """An unlabelled split's predictions at the best dev point, one JSON line per example in
  file order: `seed_<k>/predictions_<split>.jsonl` with {"source": "path:line",
  "prediction": ...} (a class name, a number, an ending's index or a tag per word)."""
  fn = task.spec.prediction
  if fn is None or jax.process_index() != 0:
    return
  lines = [
    json.dumps(
      {"source": data.examples[int(row["example_index"])].source, "prediction": fn(task, p, row)}
    )
    for row, p in zip(data.rows, preds["pred"], strict=True)
  ]
  files.write_atomic(os.path.join(seed_dir, f"predictions_{split}.jsonl"), "\n".join(lines) + "\n")


def write_predictions(seed_dir: str, data: Splits) -> None:
  """Span QA: the best point's answers as the official predictions_<split>.json."""
  for split in ("dev", "test"):
    qa = data[split].qa if data[split] else None
    if qa is not None and qa.predictions and jax.process_index() == 0:
      squad.write_predictions(os.path.join(seed_dir, f"predictions_{split}.json"), qa.predictions)


def save_best(run: SeedRun, path: str, params: Any) -> None:
  """The best dev point in the head's format (a params dir, or a feature head dir)."""
  host = jax.device_get(params)
  if jax.process_index() == 0:
    run.prep.head.save(path, run.prep.cfg, host, run.prep.tokenizer, run.best_info)
