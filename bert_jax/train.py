"""Pretraining: `train_and_evaluate(config, workdir)`.

One code path for 1 CPU, 8 fake CPU devices, TPU pods and GPU clusters: the state is created
abstractly and materialised directly sharded by the logical axis rules; `train_step` is a pure
function jitted with explicit in/out shardings and the state donated. Resume order: the
workdir's own checkpoints, then `config.init_from` (weights only), then scratch. Checkpoints
hold the data-iterator state, so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
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

from bert_jax import checkpoints as ckpt_lib
from bert_jax import (
  input_pipeline,
  interop,
  masking,
  objectives,
  optim,
  pretraining_data,
  resume,
)
from bert_jax import model as model_lib
from bert_jax import preemption as preemption_lib
from bert_jax import sharding as sh
from bert_jax import tokenizer as tokenizer_lib

# Per-chip peak dense bf16 FLOP/s by device kind, for MFU on accelerators. On CPU set
# config.log.peak_flops (the benchmark measures it).
PEAK_FLOPS = {
  "TPU v4": 275e12,
  "TPU v5 lite": 197e12,
  "TPU v5e": 197e12,
  "TPU v5p": 459e12,
  "TPU v5": 459e12,
  "TPU v6 lite": 918e12,
  "TPU v6e": 918e12,
  "NVIDIA A100-SXM4-80GB": 312e12,
  "NVIDIA A100-SXM4-40GB": 312e12,
  "NVIDIA H100 80GB HBM3": 989e12,
}


# ----------------------------------------------------------------------------- set-up


def bert_config(config: ml_collections.ConfigDict) -> model_lib.BertConfig:
  """BertConfig from `config.model`; `causal` follows the LTR objective."""
  return model_lib.BertConfig(**config.model.to_dict(), causal=bool(config.objective.ltr))


def model_and_optimizer(
  config: ml_collections.ConfigDict, platform: str
) -> tuple[model_lib.BertConfig, nn.Module, optax.GradientTransformation, objectives.Objective]:
  """(BertConfig as configured, the model with its kernels resolved for `platform`, the
  optimizer, the objective): what the trainer, aot and the benchmark compile."""
  cfg = bert_config(config)
  model = model_lib.BertForPreTraining(model_lib.resolve_kernels(cfg, platform))
  return cfg, model, optim.make_optimizer(config.opt), objectives.Objective.from_config(config)


def validate(config: ml_collections.ConfigDict, mesh, metadata: dict) -> None:
  """One-line errors, before any compute, for settings that cannot work together."""
  dp = sh.data_parallel_size(mesh)
  b, accum = config.data.batch_size, config.opt.grad_accum_steps
  if accum < 1:
    raise ValueError(f"config.opt.grad_accum_steps must be >= 1, got {accum}")
  if b % accum:
    raise ValueError(f"config.data.batch_size={b} is not divisible by grad_accum_steps={accum}")
  if (b // accum) % dp:
    raise ValueError(
      f"micro-batch {b // accum} (config.data.batch_size={b} / grad_accum_steps={accum}) is not "
      f"divisible by the data-parallel size {dp} (mesh data x fsdp = {dict(mesh.shape)})"
    )
  if b % jax.process_count():
    raise ValueError(f"config.data.batch_size={b} is not divisible by {jax.process_count()} hosts")
  tok = metadata["tokenizer"]
  if tok["vocab_size"] != config.model.vocab_size:
    raise ValueError(
      f"config.model.vocab_size={config.model.vocab_size} does not match the data's tokenizer "
      f"({tok['kind']}, vocab_size={tok['vocab_size']})"
    )
  if metadata["max_seq_length"] > config.model.max_position_embeddings:
    raise ValueError(
      f"data max_seq_length {metadata['max_seq_length']} exceeds "
      f"config.model.max_position_embeddings={config.model.max_position_embeddings}"
    )
  if config.data.dir and metadata["max_seq_length"] != config.data.max_seq_length:
    raise ValueError(
      f"config.data.max_seq_length={config.data.max_seq_length} but {config.data.dir} was built "
      f"with max_seq_length={metadata['max_seq_length']}"
    )
  if config.objective.nsp and not metadata["nsp"]:
    raise ValueError("config.objective.nsp=True but the data was built without NSP pairs")
  if config.opt.nonfinite not in ("stop", "skip"):
    raise ValueError(f"config.opt.nonfinite must be 'stop' or 'skip', not {config.opt.nonfinite!r}")
  if config.objective.ltr and config.masking.mode == "dynamic":
    logging.warning("masking.mode is ignored by the LTR objective")


# ----------------------------------------------------------------------------- steps


def accumulate_grads(
  grad_fn: Callable, params: Any, inputs: dict[str, Any], rng: Any, grad_accum_steps: int
) -> tuple[Any, Any]:
  """`grad_fn(params, inputs, rng) -> (grads, sums)` over the whole batch, in
  `grad_accum_steps` micro-batches (lax.scan) when > 1; grads and sums are added up, so a loss
  normalised by the whole batch's counts gives exactly the big-batch gradient."""
  if grad_accum_steps == 1:
    return grad_fn(params, inputs, rng)
  micro = jax.tree.map(
    lambda x: x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:]), inputs
  )

  def body(carry, xs):
    i, m = xs
    g, s = grad_fn(params, m, jax.random.fold_in(rng, i))
    return jax.tree.map(jnp.add, carry, (g, s)), None

  shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), rng)
  init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  (grads, sums), _ = jax.lax.scan(body, init, (jnp.arange(grad_accum_steps), micro))
  return grads, sums


def apply_update(state: dict, grads: Any, tx) -> tuple[dict, dict[str, Any]]:
  """The optimizer update of a train state {step, params, opt_state}, guarded: a non-finite
  gradient (possible with a finite loss) leaves params and optimizer state as they were, so no
  NaN ever reaches a checkpoint; the host stops or skips (opt.nonfinite). Returns the new state
  and {grad_norm, nonfinite}."""
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(grad_norm)
  keep = lambda new, old: jnp.where(finite, new, old)
  params = jax.tree.map(keep, params, state["params"])
  opt_state = jax.tree.map(keep, opt_state, state["opt_state"])
  new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state}
  return new_state, {"grad_norm": grad_norm, "nonfinite": 1.0 - finite.astype(jnp.float32)}


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
    grads, sums = accumulate_grads(grad_fn, state["params"], inputs, rng, grad_accum_steps)
    new_state, update_metrics = apply_update(state, grads, tx)
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
  boxed = jax.eval_shape(state_init_fn(config, model, tx), rng)
  shardings = sh.logical_shardings(boxed, mesh, rules)
  structs = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.meta.unbox(boxed), shardings
  )
  return shardings, structs


def create_state(config, model, tx, mesh, rules, rng):
  """Train state born sharded; returns (state, shardings, abstract state with shardings)."""
  return sh.init_sharded(state_init_fn(config, model, tx), mesh, rules, rng)


def jit_train_step(model, tx, obj, tables, grad_accum_steps, mesh, state_sh) -> Callable:
  """The jitted train step with explicit shardings and the state donated (trace it under
  `sharding.mesh_context`); training, the benchmark and the AOT check all use this."""
  return jax.jit(
    make_train_step(model, tx, obj, tables, grad_accum_steps),
    in_shardings=(state_sh, sh.batch_sharding(mesh), sh.replicated(mesh)),
    out_shardings=(state_sh, sh.replicated(mesh)),
    donate_argnums=0,
  )


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
  """Weights from any checkpoint `interop.load_checkpoint` reads (another run's workdir, e.g.
  phase 1 at seq 128 for phase 2 at 512, a HuggingFace or params dir), onto the training
  shardings, with a fresh optimizer. A checkpoint without MLM/NSP heads (BertModel) returns
  {"bert": ...} only: the caller keeps its freshly initialised heads. When the checkpoint
  carries a tokenizer, its vocabulary must be the data's (`tokenizer`); a bert_jax checkpoint's
  tokenizer fingerprint too, unless `allow_changes` lists 'tokenizer'."""
  ck = interop.load_checkpoint(path, target=abstract_params, like=cfg)
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


# ----------------------------------------------------------------------------- logging


def repair_metrics_log(path: str, resume_step: int) -> None:
  """Makes `path` (metrics.jsonl) the history up to `resume_step`: the rows a killed run wrote
  after its last checkpoint are replayed exactly by the resumed run, so they go; a torn last
  line (a kill or a full disk during the append) goes with a warning. Rewritten atomically."""
  try:
    lines = epath.Path(path).read_text().split("\n")
  except FileNotFoundError:
    return
  kept = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      if i < len(lines) - 1 and any(ln.strip() for ln in lines[i + 1 :]):
        raise ValueError(
          f"{path}:{i + 1} is not a JSON row ({e}); fix or remove that line"
        ) from None
      logging.warning("%s: removed a torn last line (%d bytes)", path, len(line))
      continue
    if row["step"] <= resume_step:
      kept.append(line + "\n")
  ckpt_lib.write_atomic(path, "".join(kept))


class MetricLogger:
  """metrics.jsonl + TensorBoard (process 0 only) + console.

  On an object store (gs://; no append) metrics.jsonl is kept in memory and rewritten whole at
  every row, an all-or-nothing object write (a few MB even for long runs); TensorBoard writes
  its event files to a local temporary directory that is copied to `<workdir>/tb` at most every
  `TB_SYNC_S` and at close (tensorboardX itself reaches gs:// only through tensorflow).
  """

  TB_SYNC_S = 60.0

  def __init__(self, workdir: str, resume_step: int):
    self.enabled = jax.process_index() == 0
    self.path = str(epath.Path(workdir, "metrics.jsonl"))
    self.remote = ckpt_lib.is_remote(workdir)
    self.tb = None
    if not self.enabled:
      return
    repair_metrics_log(self.path, resume_step)
    from tensorboardX import SummaryWriter

    tb_dir = str(epath.Path(workdir, "tb"))
    self._tb_remote, self._tb_synced = tb_dir, time.monotonic()
    if self.remote:
      p = epath.Path(self.path)
      self._text = p.read_text() if p.exists() else ""
      tb_dir = tempfile.mkdtemp(prefix="bert_jax_tb_")
    # purge_step hides the events a killed run logged after `resume_step` (TensorBoard would
    # show both runs' points at those steps).
    self.tb = SummaryWriter(tb_dir, purge_step=resume_step + 1)

  def _sync_tb(self) -> None:
    """Copies the local event files to the object store (each a whole-object write)."""
    self._tb_synced = time.monotonic()
    try:
      for f in epath.Path(self.tb.logdir).iterdir():
        epath.Path(self._tb_remote, f.name).write_bytes(f.read_bytes())
    except Exception as e:  # gcsfs raises its own types for HTTP errors
      raise OSError(f"cannot write {self._tb_remote}: {e}") from None

  def write(self, step: int, split: str, values: dict[str, float]) -> None:
    if not self.enabled:
      return
    row = {"step": int(step), "split": split, **{k: float(v) for k, v in values.items()}}
    if self.remote:
      ckpt_lib.write_atomic(self.path, self._text + json.dumps(row) + "\n")
      self._text += json.dumps(row) + "\n"
      self._write_tb(step, split, values)
      return
    data = (json.dumps(row) + "\n").encode()
    fd = None
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
      size = os.lseek(fd, 0, os.SEEK_END)
      try:
        while data:
          data = data[os.write(fd, data) :]
      except OSError:
        os.ftruncate(fd, size)  # no torn row left behind; truncating needs no free space
        raise
    except OSError as e:
      raise OSError(f"cannot write {self.path}: {e.strerror or e}") from None
    finally:
      if fd is not None:
        os.close(fd)
    self._write_tb(step, split, values)

  def _write_tb(self, step: int, split: str, values: dict[str, float]) -> None:
    try:
      for k, v in values.items():
        self.tb.add_scalar(f"{split}/{k}", float(v), int(step))
      self.tb.flush()
    except OSError as e:
      raise OSError(f"cannot write {self.tb.logdir}: {e.strerror or e}") from None
    if self.remote and time.monotonic() - self._tb_synced > self.TB_SYNC_S:
      self._sync_tb()

  def close(self) -> None:
    if self.tb is not None:
      self.tb.close()
      if self.remote:
        self._sync_tb()
        shutil.rmtree(self.tb.logdir, ignore_errors=True)


def console(msg: str) -> None:
  """Progress for people (stdout, process 0); absl logging stays for diagnostics."""
  if jax.process_index() == 0:
    print(msg, flush=True)


def progress_bar(frac: float, width: int = 20) -> str:
  n = int(round(frac * width))
  return "[" + "#" * n + "." * (width - n) + "]"


def format_duration(s: float) -> str:
  s = int(s)
  return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# ----------------------------------------------------------------------------- loop


def evaluate(eval_step, params, config, data_dir, mesh, batch_sharding) -> dict[str, float]:
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
    batch = input_pipeline.to_global(host_batch, mesh)
    sums = jax.device_get(eval_step(params, batch))
    hist = hist + sums.pop("target_hist")
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  out = objectives.summarize(totals)
  if np.sum(hist) > 0:
    lm = "ltr" if config.objective.ltr else "mlm"
    out[f"{lm}_majority_baseline"] = float(np.max(hist) / np.sum(hist))
  return out


def show_fill_mask(params, cfg, tokenizer, texts) -> None:
  """Prints the top predictions for each [MASK] (the bundled default ends with this)."""
  from bert_jax import api

  if jax.process_count() > 1 or not texts:
    return
  m = api.Bert(cfg, jax.device_get(params), tokenizer, {}, 0)
  for text in texts:
    preds = m.fill_mask(text, top_k=3)
    shown = " / ".join(", ".join(f"{t} {p:.2f}" for t, p in pm) for pm in preds)
    console(f"fill_mask: {text}  ->  {shown}")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `config` in `workdir`, holding its lock; returns the step reached, the last train
  and eval metrics, and `preempted` (a signal stopped it after saving: rerun to resume).
  `workdir` is a local path or gs://bucket/path (any other scheme, or gs:// without its
  packages, is one line before any compute)."""
  workdir = str(ckpt_lib.as_path(workdir, "workdir"))
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  with preemption_lib.WorkdirLock(workdir):
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  preemption_lib.clear_status(workdir)
  mesh = sh.make_mesh(config.mesh.shape)
  rules = sh.rules_from_config(config.mesh.rules)
  data_dir = pretraining_data.ensure_built(config, workdir)
  metadata = input_pipeline.read_metadata(data_dir)
  validate(config, mesh, metadata)
  tokenizer = tokenizer_lib.load_tokenizer(os.path.join(data_dir, "tokenizer"))
  if tokenizer.fingerprint != metadata["tokenizer"]["fingerprint"]:
    raise ValueError(f"{data_dir}/tokenizer does not match the fingerprint in metadata.json")

  cfg, model, tx, obj = model_and_optimizer(config, mesh.devices.flat[0].platform)
  tables = masking.tables_from_tokenizer(tokenizer)
  seq_len = metadata["max_seq_length"]

  rng = jax.random.key(config.seed)
  init_rng, step_rng = jax.random.split(rng)
  state, state_sh, abstract_state = create_state(config, model, tx, mesh, rules, init_rng)
  batch_sh = sh.batch_sharding(mesh)

  ckpt = ckpt_lib.Checkpointer(
    str(epath.Path(workdir, "checkpoints")),
    keep=config.ckpt.keep,
    every_steps=config.ckpt.every_steps,
    async_save=config.ckpt.async_save,
  )
  train_iter = iter(train_dataset(config, data_dir))

  pending: dict[str, float] = {}  # metric sums of the current, unfinished log window
  config_json = ckpt_lib.to_json(config.to_dict())
  changes: dict[str, tuple] = {}

  def check(stored: dict) -> None:
    """Runs on a checkpoint's metadata before its weights are read: a changed model or
    optimizer would otherwise fail inside orbax (and pass for a corrupt checkpoint)."""
    nonlocal changes
    source = f"{ckpt.directory}/{stored.get('step')}"
    for line in resume.check(stored, config_json, metadata, source, config.resume_allow_changes):
      console(line)
    changes = resume.compare(stored, config_json, metadata)
    ckpt_lib.check_same_architecture(stored, cfg, ckpt.directory)

  restored = ckpt.restore_latest(abstract_state, train_iter, check=check)
  if restored is not None:
    start_step, state, meta = restored
    pending = meta.get("pending_metrics", {})
    console(f"Resumed from {ckpt.directory} at step {start_step}")
  else:
    start_step = 0
    if config.init_from:
      params = restore_init_from(
        config.init_from, cfg, abstract_state["params"], tokenizer, config.resume_allow_changes
      )
      if "predictions" not in params:
        params = {**state["params"], **params}
        console(f"{config.init_from} has no MLM/NSP heads (a BertModel): they start fresh")
      state = {**state, "params": params}
      console(f"Initialised weights from {config.init_from}")

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
      ckpt_lib.write_atomic(config_path, json.dumps(meta_base["config"], indent=2))
    tok_dir = str(epath.Path(workdir, "tokenizer"))
    ckpt_lib.copytree_atomic(os.path.join(data_dir, "tokenizer"), tok_dir)

  with sh.mesh_context(mesh, rules):
    p_train_step = jit_train_step(
      model, tx, obj, tables, config.opt.grad_accum_steps, mesh, state_sh
    )
    p_eval_step = jax.jit(
      make_eval_step(model, obj, tables),
      in_shardings=(state_sh["params"], batch_sh),
      out_shardings=sh.replicated(mesh),
    )

  logger = MetricLogger(workdir, start_step)
  total_steps = config.opt.total_steps
  tokens_per_step = config.data.batch_size * seq_len
  preds = seq_len if obj.ltr else obj.masking.max_predictions
  flops_per_step = model_lib.train_flops_per_token(cfg, seq_len, preds) * tokens_per_step
  peak = config.log.peak_flops or PEAK_FLOPS.get(jax.devices()[0].device_kind, 0.0)
  peak_total = peak * jax.device_count()

  last_train: dict[str, float] = {}
  last_eval: dict[str, float] = {}
  window_start = time.perf_counter()
  window_steps = 0
  run_start, run_start_step = time.perf_counter(), start_step
  prev = None  # (step, metrics) of the step dispatched last: read after dispatching the next

  def consume(step: int, metrics) -> None:
    """Host side of a finished step: NaN check and window accumulation/logging."""
    nonlocal window_start, window_steps, pending, last_train
    m = jax.device_get(metrics)
    loss = float(m["loss"])
    if m.pop("nonfinite") or not math.isfinite(loss):
      if config.opt.nonfinite != "skip":
        raise FloatingPointError(
          f"non-finite gradient at step {step} (loss {loss}); stopped without applying it "
          "(--config.opt.nonfinite=skip skips such steps)"
        )
      logging.warning("non-finite gradient at step %d (loss %s): update skipped", step, loss)
      pending["skipped"] = pending.get("skipped", 0.0) + 1
    else:
      for k, v in m.items():
        if k not in ("loss", "grad_norm"):
          pending[k] = pending.get(k, 0.0) + float(v)
      pending["grad_norm_sum"] = pending.get("grad_norm_sum", 0.0) + float(m["grad_norm"])
    pending["steps"] = pending.get("steps", 0.0) + 1
    window_steps += 1
    if step % config.log.every_steps and step != total_steps:
      return
    summary = objectives.summarize(pending)
    applied = pending["steps"] - pending.get("skipped", 0.0)
    summary["grad_norm"] = pending.get("grad_norm_sum", math.nan) / max(applied, 1)
    if config.opt.nonfinite == "skip":
      summary["skipped_steps"] = pending.get("skipped", 0.0)
    summary["learning_rate"] = float(optim.learning_rate_schedule(config.opt)(step - 1))
    logger.write(step, "train", summary)
    now = time.perf_counter()
    sps = window_steps / max(now - window_start, 1e-9)
    perf = {"steps_per_sec": sps, "tokens_per_sec": sps * tokens_per_step}
    if peak_total:
      perf["mfu"] = sps * flops_per_step / peak_total
    logger.write(step, "perf", perf)
    eta = (total_steps - step) * (now - run_start) / max(step - run_start_step, 1)
    lm = "ltr" if obj.ltr else "mlm"
    msg = (
      f"{progress_bar(step / total_steps)} step {step}/{total_steps} | loss "
      f"{summary.get(f'{lm}_loss', float('nan')) + summary.get('nsp_loss', 0.0):.4f} | "
      f"{lm}_acc {summary.get(f'{lm}_accuracy', 0.0):.3f}"
    )
    if "nsp_accuracy" in summary:
      msg += f" | nsp_acc {summary['nsp_accuracy']:.3f}"
    msg += f" | {sps:.2f} steps/s | {perf['tokens_per_sec']:.0f} tok/s"
    if "mfu" in perf:
      msg += f" | MFU {100 * perf['mfu']:.1f}%"
    msg += f" | ETA {format_duration(eta)}"
    console(msg)
    last_train = summary
    pending = {}
    window_start, window_steps = now, 0

  step = start_step
  stop = False
  with preemption_lib.Preemption() as preempt:
    while step < total_steps and not stop:
      host_batch = next(train_iter)
      batch = input_pipeline.to_global(host_batch, mesh)
      state, metrics = p_train_step(state, batch, step_rng)
      step += 1
      if prev is not None:
        consume(*prev)
      prev = (step, metrics)
      stop = preempt.should_stop(step)  # the same step on every process
      eval_now = config.eval.every_steps and step % config.eval.every_steps == 0
      ckpt_now = step % config.ckpt.every_steps == 0 or step == total_steps
      if eval_now or ckpt_now or stop or step == total_steps:
        consume(*prev)  # the checkpoint must hold this step's metric window
        prev = None
      if eval_now or step == total_steps:
        last_eval = evaluate(p_eval_step, state["params"], config, data_dir, mesh, batch_sh)
        logger.write(step, "eval", last_eval)
        console(f"eval @ {step}: " + " | ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
      if ckpt_now or stop:
        ckpt.save(step, state, train_iter, {**meta_base, "pending_metrics": pending}, force=True)
  ckpt.close()
  logger.close()
  preempted = stop and step < total_steps
  preemption_lib.write_status(workdir, step, total_steps, preempted)
  if preempted:
    console(f"Preempted: saved step {step}; rerun the same command to resume")
  if step == total_steps and config.log.fill_mask:
    show_fill_mask(state["params"], cfg, tokenizer, list(config.log.fill_mask))
  return {"step": step, "train": last_train, "eval": last_eval, "preempted": preempted}
