"""A fine-tuning run: one recipe (a point) of every seed, or every point of `config.grid` with
the best mean dev point selected."""

from __future__ import annotations

import itertools
import os
from typing import Any

import ml_collections

from bert_jax import loop
from bert_jax.finetune import inputs, seed
from bert_jax.finetune import schema as ft_schema
from bert_jax.finetune import workdir as workdir_lib
from bert_jax.runtime import files, multihost, workdir_lock
from bert_jax.runtime import preemption as preemption_lib


def grid_points(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  g = config.grid
  axes = {"lr": tuple(g.lr), "batch_size": tuple(g.batch_size), "epochs": tuple(g.epochs)}
  axes = {k: v for k, v in axes.items() if v}
  if not axes:
    return []
  return [dict(zip(axes, vals, strict=True)) for vals in itertools.product(*axes.values())]


def point_name(point: dict[str, Any]) -> str:
  return "_".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in point.items())


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
    name = point_name({"lr": c.opt.lr, "bs": c.data.batch_size, "ep": c.opt.epochs})
    res = run_point(c, os.path.join(workdir, name))
    if res.get("preempted"):
      return res
    score = res["dev"][res["main_metric"]]["mean"]
    grid.append({"point": point, "dir": name, "dev": res["dev"], "test": res["test"]})
    if best is None or score > best[0]:
      best = (score, res)
  out = {**best[1], "grid": grid}
  workdir_lib.write(workdir, out)
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
  ft_schema.check_finetuning(config)  # the CLI checked it already; a library call too
  with preemption_lib.Preemption() as preempt:
    prep = inputs.prepare(config)
    run = seed.seed_run(config, workdir, prep)
    os.makedirs(workdir, exist_ok=True)
    with workdir_lock.WorkdirLock(workdir) as lock:
      workdir_lib.check_workdir(workdir, run.config_json, prep.inputs, config.resume_allow_changes)
      # The config is this workdir's: from here the previous record no longer describes it.
      preemption_lib.clear_status(workdir)
      unregister = multihost.on_cleanup(lambda: workdir_lib.peer_lost(run, lock))
      try:
        if run.plan.epochs > config.opt.epochs:
          loop.console(seed.more_epochs(run, config.opt.epochs, config.opt.min_steps))
        seeds = []
        for k in range(run.seeds):
          res = seed.run_seed(run, k, preempt)
          if res.get("preempted"):
            workdir_lib.write_status(workdir, "preempted", k, run.seeds)
            loop.console(f"Preempted in seed {k}: rerun the same command to resume")
            return {"preempted": True}
          seeds.append(res)
        out, summary = workdir_lib.point_results(run, seeds)
        workdir_lib.write(workdir, out)
        workdir_lib.write_status(workdir, "finished", run.seeds, run.seeds)
        for line in summary:
          loop.console(line)
        return {**out, "preempted": False}
      except Exception:
        multihost.wait_for_lost_peer()  # a lost peer ends the process here, its record written
        raise
      finally:
        unregister()
