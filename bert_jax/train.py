"""Pretraining: `train_and_evaluate(config, workdir)`.

One code path for 1 CPU, 8 fake CPU devices, TPU pods and GPU clusters: the state is created
abstractly and materialised directly sharded by the logical axis rules; `train_step` is a pure
function jitted with explicit in/out shardings and the state donated. Resume order: the
workdir's own checkpoints, then `config.init_from` (weights only), then scratch. Checkpoints
hold the data-iterator state, so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from etils import epath

from bert_jax import (
  backends,
  config_schema,
  loop,
  masking,
  model_config,
  ngram_reference,
  objectives,
  optim,
)
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax.config_schema import ConfigError
from bert_jax.data import input_pipeline, run_data
from bert_jax.interop import loader
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.runtime import files, multihost, resume, workdir_lock
from bert_jax.runtime import preemption as preemption_lib
from bert_jax.tokenizers import tokenizer as tokenizer_lib

# ----------------------------------------------------------------------------- set-up


def bert_config(config: ml_collections.ConfigDict) -> model_config.BertConfig:
  """BertConfig from `config.model`; `causal` follows the LTR objective."""
  return model_config.BertConfig(**config.model.to_dict(), causal=bool(config.objective.ltr))


def model_and_optimizer(
  config: ml_collections.ConfigDict, platform: str
) -> tuple[model_config.BertConfig, nn.Module, optax.GradientTransformation, objectives.Objective]:
  """(BertConfig as configured, the model with its kernels resolved for `platform`, the
  optimizer, the objective): what the trainer, aot and the benchmark compile."""
  cfg = bert_config(config)
  model = model_lib.BertForPreTraining(backends.resolve_kernels(cfg, platform))
  return cfg, model, optim.make_optimizer(config.opt), objectives.Objective.from_config(config)


def validate(config: ml_collections.ConfigDict, mesh, metadata: dict) -> None:
  """The config against the devices (`mesh`) and its data (`metadata`: metadata.json, or
  `run_data.planned_metadata` before the data is built): a ConfigError (exit status 2)
  before anything is written. Each field on its own: config_schema.check_pretraining."""
  dp = sh.data_parallel_size(mesh)
  b, accum = config.data.batch_size, config.opt.grad_accum_steps
  if (b // accum) % dp:
    raise ConfigError(
      f"micro-batch {b // accum} (config.data.batch_size={b} / grad_accum_steps={accum}) is not "
      f"divisible by the data-parallel size {dp} (mesh data x fsdp = {dict(mesh.shape)})"
    )
  if b % jax.process_count():
    raise ConfigError(f"config.data.batch_size={b} is not divisible by {jax.process_count()} hosts")
  eval_b = config.eval.batch_size
  if eval_b and (eval_b % dp or eval_b % jax.process_count()):
    raise ConfigError(
      f"config.eval.batch_size={eval_b} is not divisible by the data-parallel size {dp} (mesh "
      f"data x fsdp = {dict(mesh.shape)}) and the {jax.process_count()} hosts"
    )
  tok = metadata["tokenizer"]
  if tok["vocab_size"] != config.model.vocab_size:
    raise ConfigError(
      f"config.model.vocab_size={config.model.vocab_size} does not match the data's tokenizer "
      f"({tok['kind']}, vocab_size={tok['vocab_size']})"
    )
  if metadata["max_seq_length"] > config.model.max_position_embeddings:
    raise ConfigError(
      f"data max_seq_length {metadata['max_seq_length']} exceeds "
      f"config.model.max_position_embeddings={config.model.max_position_embeddings}"
    )
  # One truth: the config's max_seq_length is the data's, whether the data was given
  # (config.data.dir) or built into the workdir by an earlier run of another config.
  if metadata["max_seq_length"] != config.data.max_seq_length:
    where = config.data.dir or "the workdir's data"
    raise ConfigError(
      f"config.data.max_seq_length={config.data.max_seq_length} but {where} was built "
      f"with max_seq_length={metadata['max_seq_length']}"
    )
  if config.objective.nsp and not metadata["nsp"]:
    raise ConfigError("config.objective.nsp=True but the data was built without NSP pairs")
  if metadata.get("splits", {}).get("eval", {}).get("num_sequences", 1) == 0:
    where = config.data.dir or "<workdir>/data"
    raise ValueError(
      f"{where} has no eval sequences (built with eval_fraction="
      f"{metadata.get('eval_fraction')}): every run evaluates on its eval split; rebuild it with "
      "python -m bert_jax.create_data --eval_fraction > 0 from at least 2 documents"
    )
  if config.objective.ltr and config.masking.mode == "dynamic":
    logging.warning("masking.mode is ignored by the LTR objective")


def make_run_mesh(config: ml_collections.ConfigDict):
  """The mesh of `config.mesh.shape` on this job's devices; a shape the devices cannot take
  is a ConfigError."""
  try:
    return sh.make_mesh(config.mesh.shape)
  except ValueError as e:
    raise ConfigError(f"config.mesh.shape: {e}") from None


# ----------------------------------------------------------------------------- steps


def make_train_step(
  model: nn.Module, tx, obj: objectives.Objective, tables: Any, grad_accum_steps: int = 1
) -> Callable:
  """`train_step(state, batch, rng) -> (state, metrics)`; metrics are summed losses/counts."""

  def train_step(state, batch, rng):
    rng = jax.random.fold_in(rng, state["step"])
    inputs = objectives.prepare(batch, obj, tables)
    totals = objectives.counts(inputs, obj)

    def loss_fn(params, micro, micro_rng):
      out = objectives.forward(model, params, micro, deterministic=False, rng=micro_rng)
      sums = objectives.losses(out, micro, obj)
      return objectives.total_loss(sums, totals, obj), sums

    grad_fn = jax.grad(loss_fn, has_aux=True)
    grads, sums = optim.accumulate_grads(grad_fn, state["params"], inputs, rng, grad_accum_steps)
    new_state, update_metrics = optim.apply_update(state, grads, tx)
    metrics = {**sums, **update_metrics, "loss": objectives.total_loss(sums, totals, obj)}
    return new_state, metrics

  return train_step


def make_eval_step(model: nn.Module, obj: objectives.Objective, tables: Any) -> Callable:
  """`eval_step(params, batch) -> sums`; masks are always static so evals are comparable."""
  eval_obj = dataclasses.replace(obj, dynamic_masking=False)

  def eval_step(params, batch):
    inputs = objectives.prepare(batch, eval_obj, tables)
    out = objectives.forward(model, params, inputs, deterministic=True)
    sums = objectives.losses(out, inputs, eval_obj)
    if not obj.ltr:
      # Accuracy at the targets replaced by [MASK] only (80% of them): the 10% kept unchanged
      # are easy, so this is the harder number early in training.
      at_mask = jnp.take_along_axis(inputs["input_ids"], inputs["positions"], 1) == tables.mask_id
      w = inputs["target_weights"] * at_mask
      hit = jnp.argmax(out["mlm_logits"], -1) == inputs["targets"]
      sums["mlm_at_mask_correct"] = jnp.sum(w * hit)
      sums["mlm_at_mask_count"] = jnp.sum(w)
    # Target histogram: the accuracy of always predicting the most frequent target token is
    # the baseline an LM must beat.
    sums["target_hist"] = (
      jnp.zeros(model.cfg.vocab_size, jnp.float32)
      .at[inputs["targets"].reshape(-1)]
      .add(inputs["target_weights"].reshape(-1))
    )
    return sums

  return eval_step


# ----------------------------------------------------------------------------- state


def state_init_fn(config, model, tx) -> Callable:
  """rng -> train state with LogicallyPartitioned leaves (params and Adam moments)."""
  length = min(8, config.model.max_position_embeddings)

  def init(rng):
    params = model_lib.init_params(model, rng, length)
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

  return init


def abstract_state(config, model, tx, mesh, rules, rng) -> tuple[Any, Any]:
  """(shardings, ShapeDtypeStructs carrying them) of the train state: no compute at all."""
  return sh.abstract_sharded(state_init_fn(config, model, tx), mesh, rules, rng)


def batch_spec(config, metadata: dict[str, Any], mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The global training batch as `train_dataset` yields it and `sharding.to_global` places
  it: the data's example fields (the input pipeline's padding example) for
  config.data.batch_size rows, over the data axes."""
  example = input_pipeline.RecordReader([], metadata).padding_example()
  sharding = sh.batch_sharding(mesh)
  return {
    k: jax.ShapeDtypeStruct(
      (config.data.batch_size, *np.shape(v)), np.asarray(v).dtype, sharding=sharding
    )
    for k, v in example.items()
  }


def create_state(config, model, tx, mesh, rules, rng):
  """Train state born sharded; returns (state, shardings, abstract state with shardings)."""
  return sh.init_sharded(state_init_fn(config, model, tx), mesh, rules, rng)


def jit_train_step(model, tx, obj, tables, grad_accum_steps, mesh, state_sh) -> Callable:
  """The trainer's step as it runs (`sharding.jit_step`: explicit shardings, state donated);
  the benchmark and the AOT check compile this too. Trace it under `sharding.mesh_context`."""
  return sh.jit_step(make_train_step(model, tx, obj, tables, grad_accum_steps), mesh, state_sh)


def train_dataset(config: ml_collections.ConfigDict, data_dir: str, worker_count=None):
  """This process's shuffled, repeating training batches (seeded by config.data.seed)."""
  return input_pipeline.make_dataset(
    data_dir,
    "train",
    global_batch_size=config.data.batch_size,
    seed=config.data.seed,
    shuffle=True,
    repeat=True,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    worker_count=config.data.worker_count if worker_count is None else worker_count,
  )


def restore_init_from(
  path: str, cfg, abstract_params, tokenizer=None, allow_changes: str = ""
) -> Any:
  """Weights from any checkpoint `loader.load_checkpoint` reads (another run's workdir, e.g.
  phase 1 at seq 128 for phase 2 at 512, a HuggingFace or params dir), onto the training
  shardings, with a fresh optimizer. A checkpoint without MLM/NSP heads (BertModel) returns
  {"bert": ...} only: the caller keeps its freshly initialised heads. When the checkpoint
  carries a tokenizer, its vocabulary must be the data's (`tokenizer`); a bert_jax checkpoint's
  tokenizer fingerprint too, unless `allow_changes` lists 'tokenizer'."""
  ck = loader.load_checkpoint(path, target=abstract_params, like=cfg)
  if tokenizer is None or resume.allows("tokenizer", allow_changes):
    return ck.params
  stored_fp = ck.meta.get("tokenizer", {}).get("fingerprint")
  if stored_fp and stored_fp != tokenizer.fingerprint:
    raise ValueError(
      f"init_from {path}: its tokenizer (fingerprint {stored_fp[:12]}) is not the data's "
      f"({tokenizer.fingerprint[:12]}); allow it with --config.resume_allow_changes=tokenizer"
    )
  if ck.tokenizer is not None:
    vocab = lambda t: [t.id_to_token(i) for i in range(t.vocab_size)]
    if vocab(ck.tokenizer) != vocab(tokenizer):
      raise ValueError(f"init_from {path}: its tokenizer's vocabulary is not the data's")
  return ck.params


# ----------------------------------------------------------------------------- the run


def evaluate(eval_step, params, config, data_dir, mesh, stop=None) -> dict[str, float]:
  """Held-out LM (and NSP) metrics over the eval split, and the majority baseline. `stop()` is
  asked before each batch (on every process alike): True abandons the eval
  (`loop.EvalInterrupted`), so a signal is acted on within a batch, not after the eval."""
  ds = input_pipeline.make_dataset(
    data_dir,
    "eval",
    global_batch_size=config.eval.batch_size or config.data.batch_size,
    seed=0,
    shuffle=False,
    repeat=False,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )
  totals: dict[str, float] = {}
  hist = 0.0
  for i, host_batch in enumerate(ds):
    if config.eval.max_batches and i >= config.eval.max_batches:
      break
    if stop is not None and stop():
      raise loop.EvalInterrupted()
    batch = sh.to_global(host_batch, mesh)
    sums = jax.device_get(eval_step(params, batch))
    hist = hist + sums.pop("target_hist")
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  out = objectives.summarize(totals)
  if np.sum(hist) > 0:
    lm = objectives.lm_name(config.objective.ltr)
    out[f"{lm}_majority_baseline"] = float(np.max(hist) / np.sum(hist))
  return out


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `config` in `workdir`, holding its lock; returns the step reached, the last train
  and eval metrics, and `preempted` (a signal stopped it after saving: rerun to resume).
  `workdir` is a local path or gs://bucket/path (any other scheme, or gs:// without its
  packages, is one line before any compute). A signal before the first step (building data,
  training a vocab, restoring) raises `preemption.Preempted`, the lock released."""
  workdir = str(files.as_dir(workdir, "workdir"))
  # Every config and data mistake is one line before anything is created.
  config_schema.check_pretraining(config)
  run_data.check_source(config, workdir)  # unreadable data
  mesh = make_run_mesh(config)
  validate(config, mesh, run_data.planned_metadata(config, workdir))
  loop.check_log_paths(workdir)  # a metrics.jsonl that is a directory or a link to /dev/full
  if config.init_from and not epath.Path(workdir, "checkpoints").exists():
    # A fresh run starts from init_from: a missing path or another architecture is one line
    # before the data is built (the weights themselves are read later, onto the mesh).
    _, stored = loader.read_config(config.init_from)
    ckpt_lib.check_architecture(stored, bert_config(config), config.init_from)
  created = not epath.Path(workdir).exists()
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  try:
    with preemption_lib.Preemption() as preempt, workdir_lock.WorkdirLock(workdir) as lock:
      unregister = multihost.on_cleanup(lambda: _peer_lost(workdir, config, lock))
      try:
        return _train_and_evaluate(config, workdir, mesh, preempt)
      except Exception:
        # A collective with a dead peer fails at once on CPUs: the watch names the peer and
        # ends the process here, while its cleanup (the run's record, the lock) is registered.
        multihost.wait_for_lost_peer()
        raise
      finally:
        unregister()
  except workdir_lock.ReadOnlyWorkdir as e:  # only taking the lock raises it
    status = preemption_lib.read_status(workdir) or {}
    total = config.opt.total_steps
    if status.get("state") != "finished" or status.get("total_steps") != total:
      raise OSError(f"{e}: training needs a writable workdir") from None
    loop.console(f"{workdir} holds this run, finished at step {total}, read-only: nothing to do")
    return {"step": total, "train": {}, "eval": {}, "preempted": False}
  except BaseException:
    if created:
      _remove_unused_workdir(workdir)
    raise


def _remove_unused_workdir(workdir: str) -> None:
  """A workdir this run made and that holds nothing of a run (it failed or was stopped before
  its first step: the data would not build, init_from was refused): removed again, as a
  refused config never makes it. Only what such a run leaves goes (a vocab.txt trained for the
  data, an empty checkpoints/); anything else keeps the directory."""
  if files.is_remote(workdir) or jax.process_index() != 0:
    return
  with contextlib.suppress(OSError):
    names = set(os.listdir(workdir))
    ckpts = os.path.join(workdir, "checkpoints")
    if names - {"checkpoints"} <= {"vocab.txt"} and not (
      "checkpoints" in names and os.listdir(ckpts)
    ):
      if "checkpoints" in names:
        os.rmdir(ckpts)
      if "vocab.txt" in names:
        os.remove(os.path.join(workdir, "vocab.txt"))
      os.rmdir(workdir)


def _peer_lost(workdir: str, config, lock) -> None:
  """After a lost peer, before the process ends: the run's record and the lock (process 0).
  No collectives here (the peer is gone): the resume step is read off the directory names."""
  ckpts = epath.Path(workdir, "checkpoints")
  steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.exists() else []
  total = config.opt.total_steps
  preemption_lib.write_status(workdir, steps[-1] if steps else 0, total, True, state="peer_lost")
  lock.release()


def _train_and_evaluate(config, workdir: str, mesh, preempt) -> dict[str, Any]:
  rules = sh.rules_from_config(config.mesh.rules)
  data_dir = run_data.ensure_built(config, workdir)
  metadata = input_pipeline.read_metadata(data_dir)
  validate(config, mesh, metadata)
  tokenizer = tokenizer_lib.load_tokenizer(os.path.join(data_dir, "tokenizer"))
  if tokenizer.fingerprint != metadata["tokenizer"]["fingerprint"]:
    raise ValueError(f"{data_dir}/tokenizer does not match the fingerprint in metadata.json")

  cfg, model, tx, obj = model_and_optimizer(config, mesh.devices.flat[0].platform)
  tables = masking.tables_from_tokenizer(tokenizer)
  seq_len = metadata["max_seq_length"]

  init_rng, step_rng = jax.random.split(jax.random.key(config.seed))
  # Shapes and shardings only: a resumed run restores its state without ever initialising one.
  state_sh, abstract = abstract_state(config, model, tx, mesh, rules, init_rng)
  with sh.mesh_context(mesh, rules):
    p_train_step = jit_train_step(
      model, tx, obj, tables, config.opt.grad_accum_steps, mesh, state_sh
    )
    p_eval_step = sh.jit_eval(make_eval_step(model, obj, tables), mesh, state_sh["params"])
  # Each call traces under the mesh and its rules, as the step is lowered ahead below (and as
  # the benchmark and the AOT check trace it): the activations' logical constraints are in it.
  train_step, eval_step = (sh.under_mesh(f, mesh, rules) for f in (p_train_step, p_eval_step))
  # No checkpoints/ yet: nothing to resume, so init_from is read (or refused) before the
  # Checkpointer makes the directory.
  init_params = None
  if config.init_from and not epath.Path(workdir, "checkpoints").exists():
    init_params = restore_init_from(
      config.init_from, cfg, abstract["params"], tokenizer, config.resume_allow_changes
    )
  ckpt = ckpt_lib.Checkpointer(
    str(epath.Path(workdir, "checkpoints")),
    keep=config.ckpt.keep,
    every_steps=config.ckpt.every_steps,
    async_save=config.ckpt.async_save,
  )
  train_iter = iter(train_dataset(config, data_dir))
  config_json = ckpt_lib.to_json(config.to_dict())
  changes: dict[str, tuple] = {}

  def check(stored: dict) -> None:
    """Runs on a checkpoint's metadata before its weights are read: a changed model or
    optimizer would otherwise fail inside orbax (and pass for a corrupt checkpoint)."""
    nonlocal changes
    source = f"{ckpt.directory}/{stored.get('step')}"
    for line in resume.check(stored, config_json, metadata, source, config.resume_allow_changes):
      loop.console(line)
    changes = resume.compare(stored, config_json, metadata)
    ckpt_lib.check_architecture(ckpt_lib.bert_config_from_meta(stored), cfg, ckpt.directory)

  restored = ckpt.restore_latest(abstract, train_iter, check=check)
  window: dict[str, float] = {}
  compiling = None
  if restored is not None:
    start_step, state, meta = restored
    window = meta.get("pending_metrics", {})
    loop.console(f"Resumed from {ckpt.directory} at step {start_step}")
  else:
    start_step = 0
    # A new run: the step compiles in a thread while the state's init compiles and runs (on a
    # GPU each is about a minute for BERT-Large; serial they were a cold start's two halves).
    with sh.mesh_context(mesh, rules):
      spec = batch_spec(config, metadata, mesh)
      compiling = sh.compile_ahead(p_train_step, abstract, spec, step_rng)
      state = sh.sharded_init(state_init_fn(config, model, tx), state_sh)(init_rng)
    if config.init_from:
      params = init_params or restore_init_from(
        config.init_from, cfg, abstract["params"], tokenizer, config.resume_allow_changes
      )
      if "predictions" not in params:
        params = {**state["params"], **params}
        loop.console(f"{config.init_from} has no MLM/NSP heads (a BertModel): they start fresh")
      state = {**state, "params": params}
      loop.console(f"Initialised weights from {config.init_from}")

  # Every check has passed: from here on the workdir belongs to this run. (A refused or failed
  # resume leaves the previous run's record, run_status.json included, as it was.)
  preemption_lib.clear_status(workdir)
  meta_base = {
    "config": config_json,
    "model": dataclasses.asdict(cfg),
    "tokenizer": metadata["tokenizer"],
    "data": resume.data_signature(metadata),
    "data_dir": os.path.abspath(data_dir),
  }
  if jax.process_index() == 0:
    # config.json is the run's original config; what a resume changed goes to its own file.
    if start_step:
      if changes:
        path = str(epath.Path(workdir, "config_changes.jsonl"))
        resume.record_changes(path, start_step, changes)
    else:
      config_path = str(epath.Path(workdir, "config.json"))
      files.write_atomic(config_path, json.dumps(meta_base["config"], indent=2))
    tok_dir = str(epath.Path(workdir, "tokenizer"))
    files.copytree_atomic(os.path.join(data_dir, "tokenizer"), tok_dir)

  logger = loop.MetricLogger(workdir, start_step)
  lm = objectives.lm_name(obj.ltr)
  preds = seq_len if obj.ltr else obj.masking.max_predictions
  flops_per_token = model_lib.train_flops_per_token(cfg, seq_len, preds)
  peak = config.log.peak_flops or backends.peak_flops(jax.devices()[0].device_kind) or 0.0
  last_eval: dict[str, float] = {}

  def evaluate_and_log(step: int, state: Any) -> None:
    nonlocal last_eval
    last_eval = evaluate(eval_step, state["params"], config, data_dir, mesh, preempt.interrupts)
    ref = {}
    if step == config.opt.total_steps:  # the final eval: the count-based reference beside it
      ref = ngram_reference.reference(data_dir, obj, tables, eval_examples(config))
    logger.write(step, "eval", {**last_eval, **ref})
    loop.console(f"eval @ {step}: {loop.format_metrics(last_eval)}")
    if ref:
      loop.console(f"eval @ {step}: {reference_line(last_eval, ref, lm)}")
    last_eval.update(ref)
    if below_baseline(last_eval, lm):
      loop.console(
        f"eval @ {step}: {lm}_accuracy {last_eval[f'{lm}_accuracy']:.4f} is not above the "
        f"majority baseline {last_eval[f'{lm}_majority_baseline']:.4f} (always predicting the "
        "most frequent target): the model has learned nothing beyond token frequency yet"
      )

  def save(step: int, state: Any, window: dict[str, float]) -> None:
    ckpt.save(step, state, train_iter, {**meta_base, "pending_metrics": window}, force=True)

  def describe(step: int, summary: dict[str, float]) -> str:
    out = f"{lm}_acc {summary.get(f'{lm}_accuracy', 0.0):.3f}"
    if "nsp_accuracy" in summary:
      out += f" | nsp_acc {summary['nsp_accuracy']:.3f}"
    return out

  job = loop.Job(
    step_fn=train_step,
    batches=train_iter,
    preemption=preempt,
    mesh=mesh,
    rng=step_rng,
    total_steps=config.opt.total_steps,
    logger=logger,
    learning_rate=optim.learning_rate_schedule(config.opt),
    evaluate=evaluate_and_log,
    save=save,
    log_every=config.log.every_steps,
    eval_every=config.eval.every_steps,
    ckpt_every=config.ckpt.every_steps,
    examples_per_step=config.data.batch_size,
    nonfinite=config.opt.nonfinite,
    max_consecutive_skips=config.opt.max_consecutive_skips,
    summarize=objectives.summarize,
    describe=describe,
    flops_per_step=flops_per_token * config.data.batch_size * seq_len,
    peak_flops=peak * jax.device_count(),
  )
  if compiling is not None:
    compiling.result()  # the first batch finds the step compiled (not a second compile beside)
  with loop.closing(ckpt, logger):
    result = loop.run(job, state, start_step, window)
  total = config.opt.total_steps
  preemption_lib.write_status(workdir, result.step, total, result.preempted)
  if result.preempted:
    loop.console(f"Preempted: saved step {result.step}; rerun the same command to resume")
  elif result.step == total and below_baseline(last_eval, lm):
    loop.console(
      f"Finished, but held-out {lm}_accuracy ended at or below its majority baseline: this run "
      "did not learn (check opt.lr, opt.warmup_steps and the data)"
    )
  return {
    "step": result.step,
    "train": result.train,
    "eval": last_eval,
    "preempted": result.preempted,
  }


def eval_examples(config: ml_collections.ConfigDict) -> int | None:
  """How many held-out sequences `evaluate` scores (None: all of them)."""
  if not config.eval.max_batches:
    return None
  return config.eval.max_batches * (config.eval.batch_size or config.data.batch_size)


def reference_line(ev: dict[str, float], ref: dict[str, float], lm: str) -> str:
  """The model's held-out accuracy beside the count-based reference's on the same targets."""
  line = (
    f"{lm}_accuracy {ev[f'{lm}_accuracy']:.4f} against the count-based reference's "
    f"{ref[f'{lm}_reference_accuracy']:.4f} on the same targets"
  )
  if lm == "mlm" and "mlm_accuracy_at_mask" in ev:
    line += (
      f" (at [MASK]: {ev['mlm_accuracy_at_mask']:.4f} against "
      f"{ref['mlm_reference_accuracy_at_mask']:.4f})"
    )
  return line + " (bert_jax/ngram_reference.py)"


def below_baseline(eval_metrics: dict[str, float], lm: str) -> bool:
  """Whether held-out LM accuracy is not above always predicting the most frequent target."""
  acc, base = eval_metrics.get(f"{lm}_accuracy"), eval_metrics.get(f"{lm}_majority_baseline")
  return acc is not None and base is not None and acc <= base
