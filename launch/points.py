"""An experiment's points for launch/sweep.py: the experiment file and its ARG, the points its
sweep() adds (each a name and the ARG of its config), the trainer's command of a point, the key
that says two points pretrain the same, and --only's selection."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import sys
from typing import Any

from finetune_runs import check_keys, link_if_same


@dataclasses.dataclass(frozen=True)
class Point:
  name: str  # "key=value[,key=value]": the point's own keys, also its workdir under --root
  arg: str  # the full ARG passed to get_config


def split_experiment(spec: str) -> tuple[str, str]:
  """'FILE.py[:ARG]' -> (FILE.py, ARG)."""
  path, _, arg = spec.partition(":")
  return path, arg


def load_experiment(path: str) -> Any:
  """Imports an experiment file; one-line errors for a missing file or missing functions."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--experiment: no such file {path}")
  spec = importlib.util.spec_from_file_location(
    "experiment_" + os.path.splitext(os.path.basename(path))[0], path
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for fn in ("get_config", "sweep"):
    if not callable(getattr(module, fn, None)):
      raise ValueError(f"--experiment: {path} defines no {fn}() (see launch/sweep.py)")
  return module


def _fmt(value: Any) -> str:
  return str(value)  # bools -> True/False, which parse_arg reads back


def _merge_arg(base: str, point: dict[str, Any]) -> str:
  items: dict[str, str] = {}
  for item in filter(None, base.split(",")):
    if "=" not in item:
      raise ValueError(f"--experiment ARG item {item!r} must be key=value in a sweep")
    k, v = item.split("=", 1)
    items[k] = v
  items.update({k: _fmt(v) for k, v in point.items()})
  return ",".join(f"{k}={v}" for k, v in items.items())


def expand(path: str, arg: str = "") -> list[Point]:
  """The sweep's points; every point's config is built once so a bad point fails here."""
  module = load_experiment(path)
  raw: list[dict[str, Any]] = []

  def add(**point: Any) -> None:
    if not point:
      raise ValueError(f"{path}: sweep() called add() without arguments")
    raw.append(point)

  # sweep(add, arg) may list different points per scale (Table 6's sizes).
  if len(inspect.signature(module.sweep).parameters) > 1:
    module.sweep(add, arg)
  else:
    module.sweep(add)
  if not raw:
    raise ValueError(f"{path}: sweep() added no points")
  points = []
  for p in raw:
    name = ",".join(f"{k}={_fmt(v)}" for k, v in p.items())
    full = _merge_arg(arg, p)
    try:
      module.get_config(full)
    except ValueError as e:
      raise ValueError(f"{path}: sweep point {name}: {e}") from None
    points.append(Point(name=name, arg=full))
  names = [p.name for p in points]
  if len(set(names)) != len(names):
    raise ValueError(f"{path}: sweep() added the same point twice: {names}")
  return points


def check_overrides(path: str, arg: str, overrides: list[str]) -> None:
  """Every --config.a.b=v names an existing key (main.py would fail later, per point)."""
  check_keys(load_experiment(path).get_config(arg), overrides, path)


def command(
  path: str, point: Point, root: str, overrides: list[str], main_module: str = "bert_jax.main"
) -> list[str]:
  return [
    sys.executable,
    "-m",
    main_module,
    f"--config={path}:{point.arg}" if point.arg else f"--config={path}",
    f"--workdir={os.path.join(root, point.name)}",
    *overrides,
  ]


def pretraining_key(path: str, point: Point, overrides: list[str]) -> str:
  """What decides a pretraining run's result: the point's config and the overrides on it."""
  config = load_experiment(path).get_config(point.arg)
  payload = {"config": json.loads(config.to_json_best_effort()), "overrides": sorted(overrides)}
  return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _reuse(key: str, workdir: str, roots: list[str]) -> str | None:
  """Links `workdir` to a finished point with the same pretraining key under `roots`."""
  if os.path.lexists(workdir):
    return None
  for root in roots:
    if not os.path.isdir(root):
      continue
    for name in sorted(os.listdir(root)):
      if link_if_same(key, os.path.join(root, name), workdir):
        return os.path.join(root, name)
  return None


def _selected(points: list[Point], only: str | None) -> list[Point]:
  if not only:
    return points
  chosen = []
  for want in only.split(";"):
    match = [p for p in points if _matches(want, p.name)]
    if not match:
      raise ValueError(f"--only={want}: no such point; points: {'; '.join(p.name for p in points)}")
    chosen += [p for p in match if p not in chosen]
  return [p for p in points if p in chosen]


def _values(name: str) -> str:
  """'task=mlm,scale=cpu' -> 'mlm,cpu': --only may name a point by its values alone."""
  return ",".join(item.split("=", 1)[1] for item in name.split(","))


def _matches(want: str, name: str) -> bool:
  """Whether --only's `want` names the point `name`: every comma-separated item of it is one of
  the point's key=value items or values ('mlm' and 'task=mlm' name every seed of task=mlm)."""
  items = name.split(",")
  have = set(items) | {item.split("=", 1)[1] for item in items}
  return want in (name, _values(name)) or set(want.split(",")) <= have
