r"""Fine-tuning and downstream evaluation: `python -m bert_jax.finetune`.

  python -m bert_jax.finetune --config=configs/finetune.py:rotten_tomatoes \
      --config.init=/tmp/bert_local --workdir=/tmp/ft_rt

`config.init` is any checkpoint the one loader reads (a pretraining workdir or orbax step, a
HuggingFace or Google BERT, a params dir); its tokenizer comes with it. The run reuses the
trainer's machinery: mesh and logical-axis shardings, the optimizer (AdamW, warmup then linear
decay, weight decay not on LayerNorm/bias), the guarded update, orbax checkpoints, the
workdir lock, preemption, metrics.jsonl/TensorBoard and the progress line.

Per seed (`config.seeds` restarts; seed k uses `config.seed + k` for head init, data order and
dropout), in `<workdir>/seed_<k>/`: train for `opt.epochs` epochs, evaluate on dev every
epoch (or every `eval.every_steps`), keep the best dev point as a params dir (`best/`, with
task.json; `python -m bert_jax.convert` exports it to HuggingFace) and score test at that
point. `<workdir>/results.json` holds every seed's dev and test metrics and, per metric,
mean/std/median/min/max. A preempted or killed run resumes where it stopped: finished seeds are
kept, the running one resumes from its checkpoint bit-exactly.

`config.grid` (e.g. the paper's lr {5e-5, 3e-5, 2e-5} x batch {16, 32} x epochs {2, 3, 4})
runs every point under `<workdir>/<point>/` and selects the point with the best mean dev
score; the top-level results.json is that point's, plus the whole grid.

Batches are bucketed by length (`data.buckets`): each batch is padded to the smallest bucket
that holds its longest row, so a step compiles once per bucket. Dev and test are scored whole:
the last batch is padded with weight-0 rows, never dropped.
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import (
  backends,
  files,
  hf_io,
  input_pipeline,
  loader,
  loop,
  multihost,
  optim,
  params_tree,
  resume,
)
from bert_jax import checkpoints as ckpt_lib
from bert_jax import preemption as preemption_lib
from bert_jax import sharding as sh
from bert_jax import tasks as tasks_lib
from bert_jax import tokenizer as tokenizer_lib
from bert_jax.model_config import BertConfig
from bert_jax.tasks import batches as batches_lib
from bert_jax.tasks import features as features_lib
from bert_jax.tasks import kinds

RESULTS = "results.json"
SEED_RESULT = "result.json"
BEST = "best"
SPLITS = ("train", "dev", "test")
# BertConfig fields a fine-tuning config may set on top of the checkpoint's architecture.
RUN_FIELDS = (
  "hidden_dropout_prob",
  "attention_dropout_prob",
  "dtype",
  "param_dtype",
  "kernels",
  "dropout_rng",
  "attention_impl",
  "scan_layers",
  "remat_policy",
)


# ----------------------------------------------------------------------------- set-up


def model_config(config: ml_collections.ConfigDict) -> tuple[BertConfig, Any]:
  """(BertConfig, tokenizer or None): the checkpoint's architecture (or config.model's for a
  random init, `config.init=""`) with the run fields of config.model on top."""
  run = {k: config.model[k] for k in RUN_FIELDS if k in config.model}
  if not config.init:
    fields = {k: v for k, v in config.model.to_dict().items() if k != "causal"}
    cfg = BertConfig(**fields)
    # A vocab.txt, or a tokenizer directory (a pretraining run's <workdir>/tokenizer).
    vocab = config.data.vocab or tokenizer_lib.default_vocab_path()
    return cfg, tokenizer_lib.load_tokenizer(vocab)
  _, stored = loader.read_config(config.init)
  return dataclasses.replace(stored, **run), None


def load_task_data(config: ml_collections.ConfigDict, tokenizer) -> tuple[tasks_lib.Task, dict]:
  """Reads and encodes every split: (Task, {split: (examples, Encoded, extra) or None})."""
  from bert_jax.tasks import encode, readers

  t = config.task
  splits: dict[str, Any] = {}
  if kinds.get(t.kind).examples == "squad":
    from bert_jax.tasks import squad

    for split in SPLITS:
      if not t[split]:
        splits[split] = None
        continue
      if split == "test" and t.test == t.dev:  # one held-out file (squadshifts): read it once
        splits[split] = splits["dev"]
        continue
      examples, stats = squad.read_squad(t[split].split(","), t.max_examples)
      limit = t.max_train_examples if split == "train" else t.max_eval_examples
      if limit:
        examples = examples[:limit]
      enc, metas = squad.encode_squad(
        examples,
        tokenizer,
        config.data.max_seq_length,
        config.squad.doc_stride,
        config.squad.max_query_length,
        training=split == "train",
      )
      qa = tasks_lib.QAInfo(examples, metas, stats, tokenizer, **config.squad.to_dict())
      splits[split] = (examples, enc, qa)
    return tasks_lib.Task(
      t.name, t.kind, (), tuple(t.metrics) or kinds.default_metrics(t.kind)
    ), splits
  examples = {
    s: readers.read_split(t, s) if readers.has_split(t, s) or s == "train" else None for s in SPLITS
  }
  for s, limit in (
    ("train", t.max_train_examples),
    ("dev", t.max_eval_examples),
    ("test", t.max_eval_examples),
  ):
    if limit and examples[s] is not None:
      examples[s] = examples[s][:limit]
  # brown_pos's dev and test hold a few rare tags train lacks: task.labels_from="all" takes
  # the label set from every split (otherwise an unseen dev/test label is an error).
  extra = [examples[s] for s in ("dev", "test") if examples[s]] if t.labels_from == "all" else []
  labels = tuple(readers.label_list(t, examples["train"], extra))
  for s in SPLITS:
    if examples[s] is not None and labels:
      readers.check_labels(examples[s], labels, s)
  names = tuple(t.metrics) or kinds.default_metrics(t.kind, labels)
  task = tasks_lib.Task(t.name, t.kind, labels, names)
  for s in SPLITS:
    if examples[s] is None:
      splits[s] = None
      continue
    enc = encode.encode(examples[s], t.kind, tokenizer, config.data.max_seq_length, labels)
    splits[s] = (examples[s], enc, None)
  return task, splits


def check_task_files(task: Any) -> None:
  """One line, before any checkpoint is read, for a task file that is not there: a preset's
  line says where its files come from (`task.files_hint`). A dev split is required (best-point
  selection); a test split may be absent (dev is reported alone)."""
  for split in SPLITS:
    for path in filter(None, (task[split] or "").split(",")):
      if not files.is_remote(path) and not os.path.exists(path):
        hint = task.get("files_hint", "")
        raise FileNotFoundError(f"{path}: no such file" + (f"; {hint}" if hint else ""))
  if not task.dev and task.get("format", "auto") not in ("glue", "tfds"):
    raise ValueError(f"task {task.name}: no dev split (config.task.dev) to select on")


def optimizer_config(config: ml_collections.ConfigDict, steps_per_epoch: int) -> Any:
  """config.opt with total_steps = epochs x steps per epoch and warmup_steps from
  warmup_fraction (the paper's 10%)."""
  opt = ml_collections.ConfigDict(config.opt.to_dict())
  opt.total_steps = int(config.opt.epochs) * steps_per_epoch
  opt.warmup_steps = int(round(config.opt.warmup_fraction * opt.total_steps))
  return opt


def check_config(path: str, config_json: dict, allow_changes: str) -> None:
  """A rerun in the same workdir must be the same config (it resumes that run): a change is
  refused with one line unless `resume_allow_changes` lists it; logging may change."""
  if os.path.exists(path):
    stored = files.read_json(path)  # an empty or torn file: one line naming it
    diffs = {
      k: v
      for k, v in resume.compare({"config": stored}, config_json, {}).items()
      if not k.startswith("log.") and not resume.allows(k, allow_changes)
    }
    if diffs:
      raise ValueError(
        f"{os.path.dirname(path)} holds a run of another config "
        f"({resume.format_changes(diffs)}): use "
        "another --workdir, or allow it with --config.resume_allow_changes=FIELD"
      )
  else:
    # Seed checkpoints with no config.json beside them (deleted, or recreated by a save that
    # outlived a removal) would resume a run whose config nothing can check.
    workdir = os.path.dirname(path)
    orphans = sorted(glob.glob(os.path.join(workdir, "seed_*", "checkpoints", "*")))
    if orphans:
      raise ValueError(
        f"{workdir} holds seed checkpoints ({os.path.relpath(orphans[0], workdir)}) but no "
        "config.json to check them against: remove them or use another --workdir"
      )
    if jax.process_index() == 0:
      files.write_atomic(path, json.dumps(config_json, indent=2) + "\n")


def validate(config: ml_collections.ConfigDict, mesh) -> None:
  dp = sh.data_parallel_size(mesh)
  for name, b in (
    ("data.batch_size", config.data.batch_size),
    ("data.eval_batch_size", config.data.eval_batch_size),
  ):
    if b % dp:
      raise ValueError(
        f"config.{name}={b} is not divisible by the data-parallel size {dp} "
        f"(mesh data x fsdp = {dict(mesh.shape)})"
      )
    if b % jax.process_count():
      raise ValueError(f"config.{name}={b} is not divisible by {jax.process_count()} hosts")
  if config.opt.grad_accum_steps < 1 or config.data.batch_size % config.opt.grad_accum_steps:
    raise ValueError(
      f"config.data.batch_size={config.data.batch_size} is not divisible by "
      f"opt.grad_accum_steps={config.opt.grad_accum_steps}"
    )
  if (config.data.batch_size // config.opt.grad_accum_steps) % dp:
    raise ValueError(
      "the micro-batch (batch_size / grad_accum_steps) is not divisible by the data-parallel size"
    )
  if config.opt.nonfinite not in ("stop", "skip"):
    raise ValueError(f"config.opt.nonfinite must be 'stop' or 'skip', not {config.opt.nonfinite!r}")


# ----------------------------------------------------------------------------- steps


def state_init_fn(model, tx, length: int = 8):
  """rng -> fine-tuning train state {step, params, opt_state} with LogicallyPartitioned leaves
  (`sharding.init_sharded` materialises it sharded)."""

  def init(rng):
    shape = (1, 2, length) if kinds.get(model.kind).choices else (1, length)
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


def split_state(split_data: Any) -> str:
  """'absent' (no file), 'unlabelled' (a test split without labels: predictions, no metrics)
  or 'labelled'. The readers refuse a split labelled in some rows only."""
  if split_data is None:
    return "absent"
  first = split_data[0][0]
  unlabelled = getattr(first, "label", 0) is None or getattr(first, "tags", 0) is None
  return "unlabelled" if unlabelled else "labelled"


def evaluate(
  p_eval, params, task, split_data, config, mesh, pad_id, stop=None
) -> tuple[dict[str, float], dict[str, list]]:
  """(the task's metrics on a whole split plus its mean loss, each row's predictions); an
  unlabelled split has no metrics ({}). `stop()` is asked before each batch (on every process
  alike): True abandons the eval (`loop.EvalInterrupted`)."""
  _, enc, extra = split_data
  rows = enc.rows
  preds: dict[str, list] = {}
  loss_sum = count = 0.0
  bl = batches_lib.buckets(config)
  for batch in batches_lib.eval_batches(rows, config.data.eval_batch_size, bl, pad_id):
    if stop is not None and stop():
      raise loop.EvalInterrupted()
    out = jax.device_get(
      p_eval(params, input_pipeline.to_global(batches_lib.host_slice(batch), mesh))
    )
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
  if split_state(split_data) == "unlabelled":
    return {}, preds
  result = task.score(preds, rows, extra)
  if count:
    result["loss"] = loss_sum / count
  return result, preds


# ----------------------------------------------------------------------------- runs


def _point_name(point: dict[str, Any]) -> str:
  return "_".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in point.items())


def grid_points(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  g = config.grid
  axes = {"lr": tuple(g.lr), "batch_size": tuple(g.batch_size), "epochs": tuple(g.epochs)}
  axes = {k: v for k, v in axes.items() if v}
  if not axes:
    return []
  return [dict(zip(axes, vals, strict=True)) for vals in itertools.product(*axes.values())]


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs `config` (every grid point if config.grid has values) in `workdir`; returns the
  results dict (also written to `<workdir>/results.json`) and `preempted`."""
  points = grid_points(config)
  if not points:
    return run_point(config, workdir)
  grid = []
  best = None
  for point in points:
    c = ml_collections.ConfigDict(config.to_dict())
    c.grid.lr, c.grid.batch_size, c.grid.epochs = (), (), ()
    if "lr" in point:
      c.opt.lr = point["lr"]
    if "batch_size" in point:
      c.data.batch_size = point["batch_size"]
    if "epochs" in point:
      c.opt.epochs = point["epochs"]
    name = _point_name({"lr": c.opt.lr, "bs": c.data.batch_size, "ep": c.opt.epochs})
    res = run_point(c, os.path.join(workdir, name))
    if res.get("preempted"):
      return res
    score = res["dev"][res["main_metric"]]["mean"]
    grid.append({"point": point, "dir": name, "dev": res["dev"], "test": res["test"]})
    if best is None or score > best[0]:
      best = (score, res)
  out = {**best[1], "grid": grid}
  if jax.process_index() == 0:
    files.write_atomic(os.path.join(workdir, RESULTS), json.dumps(out, indent=2) + "\n")
  loop.console(f"grid: best dev {out['main_metric']} {best[0]:.4f} at {out['recipe']}")
  return out


def run_point(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """One recipe, every seed, in `workdir`. Everything a user can get wrong (config, checkpoint,
  task files) is checked before the workdir is touched."""
  workdir = str(files.as_dir(workdir, "--workdir"))  # an unservable scheme or a file: one line
  if files.is_remote(workdir):
    raise ValueError(
      f"--workdir={workdir}: fine-tuning writes its best/ params dir and predictions with "
      "local file APIs; use a local (or gcsfuse-mounted) directory"
    )
  with preemption_lib.Preemption() as preempt:
    prep = prepare(config)
    os.makedirs(workdir, exist_ok=True)
    with preemption_lib.WorkdirLock(workdir) as lock:
      unregister = multihost.on_cleanup(lambda: _peer_lost(workdir, config, lock))
      try:
        return _run_point(config, workdir, prep, preempt)
      finally:
        unregister()


def _peer_lost(workdir: str, config, lock) -> None:
  """After a lost peer, before the process ends: the run's record and the lock (process 0)."""
  preemption_lib.write_status(workdir, 0, config.seeds, True, state="peer_lost")
  lock.release()


@dataclasses.dataclass
class Prepared:
  mesh: Any
  rules: Any
  cfg: BertConfig
  tokenizer: Any
  init_params: Any
  task: tasks_lib.Task
  data: dict
  counts: dict
  truncated: dict
  offsets: dict


def prepare(config: ml_collections.ConfigDict) -> Prepared:
  """The mesh, the model config, the checkpoint's weights and tokenizer, the encoded splits."""
  mesh = sh.make_mesh(config.mesh.shape)
  rules = sh.rules_from_config(config.mesh.rules)
  validate(config, mesh)
  check_task_files(config.task)
  cfg, tokenizer = model_config(config)
  init_params = None
  if config.init:
    ck = loader.load_checkpoint(config.init, like=cfg)  # host arrays, placed per seed below
    tokenizer = ck.tokenizer
    init_params = ck.params["bert"] if "bert" in ck.params else ck.params
    if tokenizer is None:
      if not config.data.vocab:
        raise ValueError(f"config.init={config.init} has no tokenizer: set config.data.vocab")
      tokenizer = tokenizer_lib.WordPieceTokenizer.from_file(config.data.vocab)
  if tokenizer.vocab_size != cfg.vocab_size:
    raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model {cfg.vocab_size}")
  if config.data.max_seq_length > cfg.max_position_embeddings:
    raise ValueError(
      f"config.data.max_seq_length={config.data.max_seq_length} exceeds the model's "
      f"max_position_embeddings={cfg.max_position_embeddings}"
    )
  t0 = time.perf_counter()
  task, data = load_task_data(config, tokenizer)
  counts = {s: (len(d[0]) if d else 0) for s, d in data.items()}
  truncated = {s: (d[1].n_truncated if d else 0) for s, d in data.items()}
  loop.console(
    f"{task.name} ({task.kind}): "
    + ", ".join(
      f"{s} {counts[s]}" + (f" ({truncated[s]} truncated)" if truncated[s] else "")
      for s in SPLITS
      if data[s]
    )
    + f"; encoded in {time.perf_counter() - t0:.1f}s"
  )
  if data["train"] is None or not data["train"][1].rows:
    raise ValueError(f"task {task.name}: the train split is empty")
  if data["dev"] is None:
    raise ValueError(f"task {task.name}: no dev split (config.task.dev) to select on")
  extra_info = {
    s: d[2].stats for s, d in data.items() if d and d[2] is not None and hasattr(d[2], "stats")
  }
  if extra_info:
    loop.console(f"offset check: {json.dumps(extra_info)}")
  if features_lib.enabled(config):  # the frozen encoder runs once per row, here
    features_lib.check(config, task.kind)
    info = features_lib.add_features(config, cfg, init_params, data, tokenizer.pad_id, mesh, rules)
    loop.console(
      f"features: hidden states {info['layers']} of every row in {info['seconds']:.1f}s "
      f"({info['bytes'] / 2**20:.0f} MiB, {config.features.dtype})"
    )
  return Prepared(
    mesh, rules, cfg, tokenizer, init_params, task, data, counts, truncated, extra_info
  )


def _run_point(config, workdir: str, prep: Prepared, preempt) -> dict[str, Any]:
  mesh, rules, cfg, tokenizer = prep.mesh, prep.rules, prep.cfg, prep.tokenizer
  task, data, init_params = prep.task, prep.data, prep.init_params
  counts, truncated, extra_info = prep.counts, prep.truncated, prep.offsets

  config_json = ckpt_lib.to_json(config.to_dict())
  check_config(os.path.join(workdir, "config.json"), config_json, config.resume_allow_changes)
  # The config is this workdir's: from here the previous run's record no longer describes it.
  preemption_lib.clear_status(workdir)
  states = {s: split_state(data[s]) for s in SPLITS}
  seeds = []
  for k in range(config.seeds):
    res = run_seed(
      config, workdir, k, cfg, task, data, tokenizer, init_params, mesh, rules, preempt
    )
    if res.get("preempted"):
      preemption_lib.write_status(workdir, k, config.seeds, True)
      loop.console(f"Preempted in seed {k}: rerun the same command to resume")
      return {"preempted": True}
    seeds.append(res)
  from bert_jax.tasks import metrics

  tested = [s["test"] for s in seeds if s["test"]]  # none: no test split, or unlabelled
  results = {
    "task": task.name,
    "kind": task.kind,
    "init": config.init,
    "main_metric": task.main_metric,
    "labels": list(task.labels),
    "recipe": {
      "lr": config.opt.lr,
      "batch_size": config.data.batch_size,
      "epochs": config.opt.epochs,
      "max_seq_length": config.data.max_seq_length,
      "seeds": config.seeds,
    },
    "data": {**counts, "truncated": truncated, **({"offsets": extra_info} if extra_info else {})},
    # Each split absent, unlabelled (predictions in seed_<k>/predictions_<split>.jsonl, no
    # metrics) or labelled.
    "splits": states,
    "seeds": seeds,
    "dev": metrics.summarize_seeds([s["dev"] for s in seeds]),
    "test": metrics.summarize_seeds(tested) if tested else {},
    # What a model that learned nothing scores (majority class, chance, ...), and the seeds
    # (by index) whose main metric is at or below it.
    "baseline": _baseline(task, data, seeds),
    "config": config_json,
  }
  if jax.process_index() == 0:
    files.write_atomic(os.path.join(workdir, RESULTS), json.dumps(results, indent=2) + "\n")
  preemption_lib.write_status(workdir, config.seeds, config.seeds, False)
  if states["test"] == "absent":
    loop.console(f"{task.name} test: no test split (config.task.test is empty): dev only")
  elif states["test"] == "unlabelled":
    loop.console(
      f"{task.name} test: unlabelled, so no metrics: each seed's predictions at its best dev "
      f"point are in {workdir}/seed_<k>/predictions_test.jsonl"
    )
  for split in ("dev", "test"):
    s = results[split].get(task.main_metric)
    if s:
      base = results["baseline"]
      low = base.get("at_or_below", {}).get(split, [])
      loop.console(
        f"{task.name} {split} {task.main_metric}: {s['mean']:.4f} ± {s['std']:.4f} "
        f"(median {s['median']:.4f}, min {s['min']:.4f}, max {s['max']:.4f}, {s['n']} "
        f"seed{'s' if s['n'] != 1 else ''})"
        + metrics.baseline_note(base, split, task.main_metric, low, s["n"])
      )
  return {**results, "preempted": False}


def _baseline(task: tasks_lib.Task, data: dict, seeds: list[dict]) -> dict[str, Any]:
  """results.json's baseline (tasks.kinds.baseline) with the seeds at or below it."""
  from bert_jax.tasks import metrics

  evals = {s: data[s][1].rows for s in ("dev", "test") if data[s] is not None}
  base = kinds.baseline(task.kind, task.metrics, task.labels, data["train"][1].rows, evals)
  if base["name"] != "none":
    base["at_or_below"] = {
      s: metrics.at_or_below(base, [r[s] for r in seeds], s, task.main_metric) for s in evals
    }
  return base


def run_seed(config, workdir, k, cfg, task, data, tokenizer, init_params, mesh, rules, preempt):
  """Trains seed k (resuming its checkpoint), returns its result (also `seed_<k>/result.json`)."""
  seed_dir = os.path.join(workdir, f"seed_{k}")
  done = os.path.join(seed_dir, SEED_RESULT)
  if os.path.exists(done):
    return files.read_json(done, keys=("dev", "test"))
  os.makedirs(seed_dir, exist_ok=True)
  seed = config.seed + k
  rows = data["train"][1].rows
  batch_size = config.data.batch_size
  per_epoch = math.ceil(len(rows) / batch_size)
  opt = optimizer_config(config, per_epoch)
  total_steps = opt.total_steps
  eval_every = config.eval.every_steps or per_epoch
  run_cfg = backends.resolve_kernels(cfg, mesh.devices.flat[0].platform)
  if features_lib.enabled(config):
    model = features_lib.model(config, run_cfg, task)
  else:
    model = task.model(run_cfg, config.head.bilstm)
  tx = optim.make_optimizer(opt)
  init_rng, step_rng = jax.random.split(jax.random.key(seed))
  init_fn = state_init_fn(model, tx, min(8, cfg.max_position_embeddings))
  state, state_sh, abstract = sh.init_sharded(init_fn, mesh, rules, init_rng)
  ckpt = ckpt_lib.Checkpointer(
    os.path.join(seed_dir, "checkpoints"),
    keep=config.ckpt.keep,
    every_steps=eval_every,
    async_save=config.ckpt.async_save,
  )
  restored = ckpt.restore_latest(abstract)
  best: dict[str, Any] = {"step": 0, "dev": None, "test": {}}
  window: dict[str, float] = {}
  if restored is not None:
    start_step, state, meta = restored
    best, window = meta["best"], meta.get("pending_metrics", {})
    loop.console(f"seed {k}: resumed at step {start_step}")
  else:
    start_step = 0
    if init_params is not None and "bert" in abstract["params"]:
      placed = params_tree.place(
        params_tree.to_layout(init_params, cfg.scan_layers), abstract["params"]["bert"]
      )
      state = {**state, "params": {**state["params"], "bert": placed}}

  with sh.mesh_context(mesh, rules):
    p_train = sh.jit_step(
      make_train_step(model, tx, task, config.opt.grad_accum_steps), mesh, state_sh
    )
    p_eval = sh.jit_eval(make_eval_step(model, task), mesh, state_sh["params"])
  logger = loop.MetricLogger(seed_dir, start_step)
  config_json = ckpt_lib.to_json(config.to_dict())
  main = task.main_metric
  run_start = time.perf_counter()

  def evaluate_split(split, params):
    return evaluate(
      p_eval, params, task, data[split], config, mesh, tokenizer.pad_id, preempt.interrupts
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
      save_best(os.path.join(seed_dir, BEST), cfg, state["params"], tokenizer, task, config)
      write_predictions(seed_dir, data)
      if test_preds is not None and split_state(data["test"]) == "unlabelled":
        write_split_predictions(seed_dir, task, "test", data["test"], test_preds)
      msg += "  (best so far)"
    loop.console(msg)

  def save(step: int, state: Any, window: dict[str, float]) -> None:
    meta = {"best": best, "config": config_json, "pending_metrics": window}
    ckpt.save(step, state, None, meta, force=True)

  bl = batches_lib.buckets(config)
  job = loop.Job(
    step_fn=p_train,
    batches=map(
      batches_lib.host_slice,
      batches_lib.train_batches(rows, seed, batch_size, start_step, bl, tokenizer.pad_id),
    ),
    preemption=preempt,
    mesh=mesh,
    rng=step_rng,
    total_steps=total_steps,
    logger=logger,
    learning_rate=optim.learning_rate_schedule(opt),
    evaluate=evaluate_and_select,
    save=save,
    log_every=config.log.every_steps,
    eval_every=eval_every,
    ckpt_every=eval_every,
    examples_per_step=batch_size,
    nonfinite=config.opt.nonfinite,
    max_consecutive_skips=config.opt.max_consecutive_skips,
    describe=lambda step, _: f"epoch {(step - 1) // per_epoch + 1}/{config.opt.epochs}",
    label=f"seed {k + 1}/{config.seeds}",
  )
  with loop.closing(ckpt, logger):
    result = loop.run(job, state, start_step, window)
  if result.preempted:
    return {"preempted": True}
  out = {
    "seed": seed,
    "best_step": best["step"],
    "best_epoch": math.ceil(best["step"] / per_epoch),
    "dev": best["dev"],
    "test": best["test"],
    "train_seconds": round(time.perf_counter() - run_start, 1),
  }
  if jax.process_index() == 0:
    files.write_atomic(done, json.dumps(out, indent=2) + "\n")
  return out


def write_split_predictions(
  seed_dir: str, task: tasks_lib.Task, split: str, split_data: Any, preds: dict[str, list]
) -> None:
  """An unlabelled split's predictions at the best dev point, one JSON line per example in
  file order: `seed_<k>/predictions_<split>.jsonl` with {"source": "path:line",
  "prediction": ...} (a class name, a number, an ending's index or a tag per word)."""
  fn = task.spec.prediction
  if fn is None or jax.process_index() != 0:
    return
  examples, enc, _ = split_data
  lines = [
    json.dumps(
      {"source": examples[int(row["example_index"])].source, "prediction": fn(task, p, row)}
    )
    for row, p in zip(enc.rows, preds["pred"], strict=True)
  ]
  files.write_atomic(os.path.join(seed_dir, f"predictions_{split}.jsonl"), "\n".join(lines) + "\n")


def write_predictions(seed_dir: str, data: dict) -> None:
  """Span QA: the best point's answers as the official predictions_<split>.json."""
  from bert_jax.tasks import squad

  for split in ("dev", "test"):
    qa = data[split][2] if data[split] else None
    if isinstance(qa, tasks_lib.QAInfo) and qa.predictions and jax.process_index() == 0:
      squad.write_predictions(os.path.join(seed_dir, f"predictions_{split}.json"), qa.predictions)


def save_best(path, cfg, params, tokenizer, task: tasks_lib.Task, config) -> None:
  """The best dev point as a params dir + task.json (convert exports it to HuggingFace)."""
  host = jax.device_get(params)
  if jax.process_index() != 0:
    return
  info = {
    "kind": task.kind,
    "labels": list(task.labels),
    "task": task.name,
    "max_seq_length": config.data.max_seq_length,
    "bilstm": bool(config.head.bilstm),
  }
  if features_lib.enabled(config):  # head only: a params dir needs the encoder
    features_lib.save_head(path, cfg, host, tokenizer, info, config)
    return
  hf_io.save_params_dir(path, cfg, host, overwrite=True, tokenizer=tokenizer, task=info)


# ----------------------------------------------------------------------------- entry point


def _define_flags() -> dict[str, Any]:
  """The CLI's flags, defined when the CLI runs (never at import: this module is a library)."""
  from absl import flags
  from ml_collections import config_flags

  out = {
    "config": config_flags.DEFINE_config_file(
      "config",
      None,
      "configs/finetune.py:TASK[,key=value] (or the bundled name finetune:TASK).",
      lock_config=True,
    ),
    "workdir": flags.DEFINE_string("workdir", None, "Directory for the run (results.json, seeds)."),
    "distributed": flags.DEFINE_bool(
      "distributed", False, "Call jax.distributed.initialize() (multi-host)."
    ),
    "num_cpu_devices": flags.DEFINE_integer("num_cpu_devices", None, "Fake this many CPU devices."),
  }
  flags.mark_flags_as_required(["config", "workdir"])
  return out


def run() -> None:
  """`python -m bert_jax.finetune`. Exit status: 0 done; 75 preempted after saving (rerun to
  resume); 1 an error a user can fix (one line); 2 a bad flag or config."""
  import sys

  from bert_jax import cli

  f = _define_flags()

  def main(argv: list[str]) -> None:
    del argv
    if f["num_cpu_devices"].value:
      jax.config.update("jax_num_cpu_devices", f["num_cpu_devices"].value)
    if f["distributed"].value:
      multihost.initialize("finetune")
    try:
      result = finetune(f["config"].value, f["workdir"].value)
    except Exception:
      multihost.wait_for_lost_peer()  # a lost peer ends the process in one line, exit 75
      raise
    if f["distributed"].value:
      multihost.shutdown()
    if result.get("preempted"):
      sys.exit(preemption_lib.EXIT_PREEMPTED)

  cli.run(main, "finetune", compilation_cache=True)


if __name__ == "__main__":
  run()
