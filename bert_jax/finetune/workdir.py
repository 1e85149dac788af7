"""What a fine-tuning workdir holds besides its seeds, and its one run.

A workdir belongs to one run: the same config (`config.json`) on the same inputs
(`inputs.json`: the task files by content, the init checkpoint's step and weights, the
tokenizer). A rerun resumes that run, and its seeds are averaged together, so a change is one
line naming it. `results.json` holds every seed's dev and test metrics, per metric
mean/std/median/min/max and what a model that learned nothing scores (summarised in one line
per split); `run_status.json` says how the run ended."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import jax

from bert_jax import loop
from bert_jax import tasks as tasks_lib
from bert_jax.finetune import data as data_lib
from bert_jax.finetune.seed import SEED_RESULT, SeedRun
from bert_jax.runtime import files, resume
from bert_jax.runtime import preemption as preemption_lib
from bert_jax.tasks import kinds, metrics

CONFIG = "config.json"
RESULTS = "results.json"
INPUTS = "inputs.json"  # the run's inputs by content (inputs.Prepared.inputs)
SPLITS = ("train", "dev", "test")
# Config keys that name where an input lies: when inputs.json says its content is unchanged, a
# new path to it is no change (as pretraining's data.dir).
INPUT_PATHS = (
  "init",
  "task.train",
  "task.dev",
  "task.test",
  "task.glue_dir",
  "task.tfds_data_dir",
  "data.vocab",  # the tokenizer: its fingerprint is compared
)


def check_workdir(
  workdir: str, config_json: dict, inputs: dict[str, Any], allow_changes: str
) -> None:
  """A rerun in the same workdir must be the same config on the same inputs (it resumes that
  run, and its seeds are averaged together): a config change is refused with one line unless
  `resume_allow_changes` lists it (logging may change); a changed input (`inputs.json`: the
  task files' contents, the init checkpoint's step and weights, the tokenizer) always is. An
  input's path is not compared when its content is: the same file elsewhere is no change."""
  path = os.path.join(workdir, CONFIG)
  inputs_path = os.path.join(workdir, INPUTS)
  recorded = os.path.exists(inputs_path)
  if os.path.exists(path):
    stored = files.read_json(path)  # an empty or torn file: one line naming it
    if recorded:
      check_inputs(workdir, files.read_json(inputs_path, keys=("task", "init")), inputs)
    # Logging may change; an input's path may when its content is compared (inputs.json).
    allowed = ",".join(("log", allow_changes, *(INPUT_PATHS if recorded else ())))
    diffs = resume.config_changes(stored, config_json, allowed)
    if diffs:
      raise ValueError(
        f"{workdir} holds a run of another config "
        f"({resume.format_changes(diffs)}): use "
        "another --workdir, or allow it with --config.resume_allow_changes=FIELD"
      )
    if not recorded:
      loop.console(
        f"{inputs_path}: recorded now (the run was started by a version that did not record "
        "its inputs: the seeds finished before are not checked against them)"
      )
  else:
    # Seed checkpoints with no config.json beside them (deleted, or recreated by a save that
    # outlived a removal) would resume a run whose config nothing can check.
    orphans = sorted(glob.glob(os.path.join(workdir, "seed_*", "checkpoints", "*")))
    if orphans:
      raise ValueError(
        f"{workdir} holds seed checkpoints ({os.path.relpath(orphans[0], workdir)}) but no "
        "config.json to check them against: remove them or use another --workdir"
      )
  if jax.process_index() == 0:
    if not recorded:
      files.write_atomic(inputs_path, json.dumps(inputs, indent=2) + "\n")
    if not os.path.exists(path):
      files.write_atomic(path, json.dumps(config_json, indent=2) + "\n")


def check_inputs(workdir: str, stored: dict[str, Any], now: dict[str, Any]) -> None:
  """One line naming every input of `workdir`'s run that changed since it started."""
  short = lambda d, key: (d or {}).get(key, "none")[:12] if (d or {}).get(key) else "none"
  changes = []
  for split in SPLITS:
    a, b = stored["task"].get(split), now["task"].get(split)
    if short(a, "sha256") != short(b, "sha256"):
      where = ",".join((b or a)["files"])
      changes.append(f"task.{split} {where} (sha256 {short(a, 'sha256')} -> {short(b, 'sha256')})")
  if stored.get("tokenizer") != now.get("tokenizer"):
    changes.append(
      f"the tokenizer (fingerprint {str(stored.get('tokenizer'))[:12]} -> "
      f"{str(now.get('tokenizer'))[:12]})"
    )
  a, b = stored.get("init"), now.get("init")
  hint = ""
  if short(a, "params_sha256") != short(b, "params_sha256"):
    steps = ""
    if a and b and a.get("step") != b.get("step"):
      steps = f"step {a.get('step')} -> {b.get('step')}, "
      if a.get("format") == "workdir" and a.get("step") is not None:
        hint = f" (--config.init={a['path']}/checkpoints/{a['step']} if that step is kept)"
    changes.append(
      f"config.init {(b or a)['path'] or '(random)'} ({steps}weights sha256 "
      f"{short(a, 'params_sha256')} -> {short(b, 'params_sha256')})"
    )
  if changes:
    raise ValueError(
      f"{workdir} holds a run on other inputs, and its seeds would mix both: "
      f"{'; '.join(changes)} (then -> now); restore them{hint}, or start afresh with another "
      f"--workdir (or after removing {workdir})"
    )


def peer_lost(run: SeedRun, lock) -> None:
  """After a lost peer, before the process ends: the run's record and the lock (process 0)."""
  done = sum(
    os.path.exists(os.path.join(run.workdir, f"seed_{k}", SEED_RESULT)) for k in range(run.seeds)
  )
  write_status(run.workdir, "peer_lost", done, run.seeds)
  lock.release()


def write_status(workdir: str, state: str, seeds_done: int, seeds: int) -> None:
  """run_status.json as pretraining's (`launch/sweep.py` reads its `state`: finished,
  preempted, peer_lost) with what a fine-tuning run counts: its finished seeds of `seeds`."""
  if jax.process_index() == 0:
    record = {"state": state, "seeds_done": int(seeds_done), "seeds": int(seeds)}
    files.write_atomic(os.path.join(workdir, preemption_lib.STATUS_FILE), json.dumps(record))


# ----------------------------------------------------------------------------- results


def point_results(run: SeedRun, seeds: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
  """results.json's content for the finished `seeds` of `run`, and the run's last lines (what
  the test split was, each split's main metric beside its baseline, the nothing-learned
  warning)."""
  prep, plan, config = run.prep, run.plan, run.config_json
  task, data = prep.task, prep.data
  tested = [s["test"] for s in seeds if s["test"]]  # none: no test split, or unlabelled
  offsets = {"offsets": prep.offsets} if prep.offsets else {}
  results = {
    "task": task.name,
    "kind": task.kind,
    "init": config["init"],
    "main_metric": task.main_metric,
    "labels": list(task.labels),
    "recipe": {
      "lr": config["opt"]["lr"],
      "batch_size": run.batch_size,
      "epochs": config["opt"]["epochs"],
      "max_seq_length": config["data"]["max_seq_length"],
      "seeds": run.seeds,
      # What each seed ran: opt.epochs, or more to reach opt.min_steps (seed.schedule).
      "epochs_run": plan.epochs,
      "steps": plan.total_steps,
    },
    "data": {**prep.counts, "truncated": prep.truncated, **offsets},
    # What the seeds read, by content (inputs.json): task files, the init's step and weights.
    "inputs": prep.inputs,
    # Each split absent, unlabelled (predictions in seed_<k>/predictions_<split>.jsonl, no
    # metrics) or labelled.
    "splits": {s: data_lib.split_state(data[s]) for s in data_lib.SPLITS},
    "seeds": seeds,
    "dev": metrics.summarize_seeds([s["dev"] for s in seeds]),
    "test": metrics.summarize_seeds(tested) if tested else {},
    # What a model that learned nothing scores (majority class, chance, ...), and the seeds
    # (by index) whose main metric is at or below it.
    "baseline": baseline(task, data, seeds),
    "config": config,
  }
  lines = summary(run.workdir, results)
  warning = learned_nothing(results, run)
  if warning:
    results["warnings"] = [warning]
    lines.append(f"warning: {warning}")
  return results, lines


def baseline(task: tasks_lib.Task, data: data_lib.Splits, seeds: list[dict]) -> dict[str, Any]:
  """results.json's baseline (tasks.kinds.baseline) with the seeds at or below it."""
  evals = {s: data[s].rows for s in ("dev", "test") if data[s] is not None}
  base = kinds.baseline(task.kind, task.metrics, task.labels, data["train"].rows, evals)
  if base["name"] != "none":
    base["at_or_below"] = {
      s: metrics.at_or_below(base, [r[s] for r in seeds], s, task.main_metric) for s in evals
    }
  return base


def learned_nothing(results: dict[str, Any], run: SeedRun) -> str:
  """The warning for a run whose every seed is at or below the baseline on dev (a model that
  learned nothing scores as well), naming the recipe and what to change; '' otherwise."""
  base, metric, opt = results["baseline"], results["main_metric"], run.config_json["opt"]
  low, n = base.get("at_or_below", {}).get("dev", []), len(results["seeds"])
  if not n or len(low) < n:
    return ""
  who = "the seed" if n == 1 else f"all {n} seeds"
  return (
    f"{who} scored dev {metric} at or below the {base['name']} "
    f"({base['dev'][metric]:.4f}): nothing measurable was learned in {run.plan.total_steps} "
    f"steps; try a larger --config.opt.lr (now {opt['lr']:g}), a smaller "
    f"--config.data.batch_size (now {run.batch_size}) or more steps (--config.opt.epochs, now "
    f"{opt['epochs']}, or --config.opt.min_steps, now {opt.get('min_steps', 0)})"
  )


def write(workdir: str, results: dict[str, Any]) -> None:
  if jax.process_index() == 0:
    files.write_atomic(os.path.join(workdir, RESULTS), json.dumps(results, indent=2) + "\n")


def summary(workdir: str, results: dict[str, Any]) -> list[str]:
  """What the test split was, and each split's main metric over the seeds beside its baseline."""
  name, main, states = results["task"], results["main_metric"], results["splits"]
  lines = []
  if states["test"] == "absent":
    lines.append(f"{name} test: no test split (config.task.test is empty): dev only")
  elif states["test"] == "unlabelled":
    lines.append(
      f"{name} test: unlabelled, so no metrics: each seed's predictions at its best dev "
      f"point are in {workdir}/seed_<k>/predictions_test.jsonl"
    )
  base = results["baseline"]
  for split in ("dev", "test"):
    s = results[split].get(main)
    if s:
      low = base.get("at_or_below", {}).get(split, [])
      lines.append(
        f"{name} {split} {main}: {s['mean']:.4f} ± {s['std']:.4f} "
        f"(median {s['median']:.4f}, min {s['min']:.4f}, max {s['max']:.4f}, {s['n']} "
        f"seed{'s' if s['n'] != 1 else ''})" + metrics.baseline_note(base, split, main, low, s["n"])
      )
  return lines
