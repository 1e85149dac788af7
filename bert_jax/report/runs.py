"""The runs below a root: pretraining runs (metrics.jsonl + config.json, written by train.py)
and fine-tuning runs (results.json, written by bert_jax.finetune).

A fine-tuning tree is `<root>/<point>/finetune/<task>/results.json` (a sweep: <point> is the
pretraining run's workdir), or a fine-tuning workdir given directly (the point is then the
checkpoint the run started from, its `init`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from bert_jax import trees
from bert_jax.runtime.files import read_json

REPORT_DIR = "report"


@dataclass
class Run:
  name: str  # path relative to the root
  config: dict[str, Any]  # flattened: {"objective.nsp": True, ...}
  rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # split -> rows

  def last(self, split: str) -> dict[str, float]:
    return self.rows.get(split, [{}])[-1]

  def steps(self) -> int:
    return max((int(r["step"]) for rs in self.rows.values() for r in rs), default=0)


def config_fields(config: dict[str, Any]) -> dict[str, Any]:
  """A config.json as {"objective.nsp": True, ...}: lists become tuples, empty sections go."""
  flat = trees.flatten(config, ".")
  return {k: tuple(v) if isinstance(v, list) else v for k, v in flat.items() if v != {}}


def read_metrics(path: str) -> dict[str, list[dict[str, float]]]:
  """metrics.jsonl -> {split: rows sorted by step}; a bad line is an error naming it."""
  rows: dict[str, list[dict[str, float]]] = {}
  with open(path) as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        split, step = row["split"], int(row["step"])
      except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}:{i}: not a metrics row (JSON with step and split)") from None
      rows.setdefault(split, []).append({**row, "step": step})
  for rs in rows.values():
    rs.sort(key=lambda r: r["step"])
  return rows


_SKIPPED_DIRS = (REPORT_DIR, "checkpoints", "tb", "data")
# A fine-tuning tree: <point>/finetune/..., a run's seed_<k>/ (each with its own metrics.jsonl).
_FINETUNE_DIR = "finetune"
FINETUNE_RESULTS = "results.json"
_SEED_DIR = re.compile(r"seed_\d+")


def _check_root(root: str) -> None:
  if not os.path.isdir(root):
    raise FileNotFoundError(f"--root={root}: no such directory")


def find_runs(root: str, required: bool = True) -> list[Run]:
  """Pretraining runs below root (fine-tuning trees excluded); with `required`, none is an
  error."""
  _check_root(root)
  runs = []
  for d, dirs, files in os.walk(root, followlinks=True):
    if FINETUNE_RESULTS in files:  # a fine-tuning workdir: its seeds are not pretraining runs
      dirs[:] = []
      continue
    dirs[:] = sorted(
      x for x in dirs if x not in (*_SKIPPED_DIRS, _FINETUNE_DIR) and not _SEED_DIR.fullmatch(x)
    )
    if "metrics.jsonl" not in files:
      continue
    config = {}
    path = os.path.join(d, "config.json")
    if os.path.isfile(path):
      config = config_fields(read_json(path))
    name = os.path.relpath(d, root)
    runs.append(Run(name, config, read_metrics(os.path.join(d, "metrics.jsonl"))))
  if not runs and required:
    raise ValueError(f"--root={root}: no run (a directory with metrics.jsonl) below it")
  return runs


@dataclass
class FinetuneRun:
  point: str  # the pretraining point: the path before /finetune/, else the run's init
  task: str
  path: str  # its results.json
  results: dict[str, Any]
  # Other results.json of the same point and task (an unfinished grid: no top-level file
  # yet); this run is the best of them on dev, as the grid's own choice would be.
  others: list[str] = field(default_factory=list)

  def summary(self, split: str) -> dict[str, float] | None:
    """{mean, std, n, ...} of the main metric on `split`, or None when the run has none."""
    metric = self.results["main_metric"]
    s = self.results.get(split, {}).get(metric)
    if s is not None:
      return s
    values = [r[split][metric] for r in self.results.get("seeds", []) if metric in r.get(split, {})]
    if not values:
      return None
    from bert_jax.tasks import metrics  # only for results.json files without the summary

    return metrics.summarize(values)


def find_finetune_runs(root: str) -> list[FinetuneRun]:
  """Every results.json below root (a grid's top-level one stands for its points)."""
  _check_root(root)
  runs = []
  for d, dirs, files in os.walk(root, followlinks=True):
    dirs[:] = sorted(x for x in dirs if x not in _SKIPPED_DIRS and not _SEED_DIR.fullmatch(x))
    if FINETUNE_RESULTS not in files:
      continue
    dirs[:] = []
    path = os.path.join(d, FINETUNE_RESULTS)
    with open(path) as f:
      try:
        results = json.load(f)
      except ValueError:
        raise ValueError(f"{path}: not valid JSON") from None
    if not isinstance(results, dict) or not {"task", "main_metric"} <= set(results):
      raise ValueError(f"{path}: not a fine-tuning results.json (no task or main_metric)")
    parts = os.path.relpath(d, root).split(os.sep)
    if _FINETUNE_DIR in parts:
      i = len(parts) - 1 - parts[::-1].index(_FINETUNE_DIR)
      point = os.path.join(*parts[:i]) if i else "."
    else:
      point = str(results.get("init") or os.path.relpath(d, root))
    runs.append(FinetuneRun(point, str(results["task"]), path, results))
  return _best_on_dev(runs)


def _best_on_dev(runs: list[FinetuneRun]) -> list[FinetuneRun]:
  """One run per (point, task): the best mean dev main metric; the rest go to `others`."""
  groups: dict[tuple[str, str], list[FinetuneRun]] = {}
  for r in runs:
    groups.setdefault((r.point, r.task), []).append(r)
  out = []
  for group in groups.values():
    dev = lambda r: (r.summary("dev") or {"mean": -math.inf})["mean"]
    best = max(group, key=dev)  # first of equals: walk order, deterministic
    best.others = [r.path for r in group if r is not best]
    out.append(best)
  return out
