"""Runs every point of an experiment's sweep, one workdir per point.

  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:scale=cpu \
      --root=/tmp/table5 [--dry_run] [--only=task=mlm] [--config.opt.total_steps=100 ...]

--only takes a point's name or just its values (`--only=mlm`), several separated by ';'.

Convention: an experiment file defines `get_config(arg)` and `sweep(add)`; `sweep` calls
`add(key=value, ...)` once per point, with keys of the file's own `:ARG` (the values
`config_lib.parse_arg` accepts). A point's ARG is the `--experiment` ARG with the point's keys
set on top (the point wins), so every point is reproducible by hand as
`python -m bert_jax.main --config=FILE:ARG`. Its name, and its workdir under --root, is the
point's own `key=value[,key=value]` (e.g. `task=mlm`). Any `--config.x=y` flags are passed on
to every point (checked against the config first).

Points run locally one after another (`python -m bert_jax.main ...`). A point is finished
only when its run exited 0 and its own record (`run_status.json`) says it reached its last
step; it then gets `sweep_done.json` in its workdir and is skipped (delete it to rerun). A
point stopped any other way resumes from its checkpoints next time. A preempted point (exit
75, or SIGTERM/SIGINT/SIGHUP to this script, which it passes on to the running point) stops
the sweep with exit status 75: rerun the same command to resume. Failures are reported at the
end and make the exit status 1.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from bert_jax import preemption

DONE = "sweep_done.json"


class Preempted(Exception):
  """A point's run was preempted (it saved a checkpoint): the sweep stops, to be rerun."""


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
  config = load_experiment(path).get_config(arg)
  for o in overrides:
    key = o.split("=", 1)[0][len("--config.") :]
    node = config
    for part in key.split("."):
      if not hasattr(node, "keys") or part not in node:
        raise ValueError(f"{o.split('=', 1)[0]}: no such key in the config of {path}")
      node = node[part]


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


def _selected(points: list[Point], only: str | None) -> list[Point]:
  if not only:
    return points
  chosen = []
  for want in only.split(";"):
    match = [p for p in points if want in (p.name, _values(p.name))]
    if not match:
      raise ValueError(f"--only={want}: no such point; points: {'; '.join(p.name for p in points)}")
    chosen += [p for p in match if p not in chosen]
  return [p for p in points if p in chosen]


def _values(name: str) -> str:
  """'task=mlm,scale=cpu' -> 'mlm,cpu': --only may name a point by its values alone."""
  return ",".join(item.split("=", 1)[1] for item in name.split(","))


def run(
  experiment: str,
  root: str,
  overrides: list[str] = (),
  only: str | None = None,
  dry_run: bool = False,
  env: dict[str, str] | None = None,
  main_module: str = "bert_jax.main",
) -> list[str]:
  """Runs (or prints) the sweep; returns the names of points that failed."""
  path, arg = split_experiment(experiment)
  overrides = list(overrides)
  for o in overrides:
    if not o.startswith("--config.") or "=" not in o:
      raise ValueError(f"unexpected argument {o!r}: only --config.KEY=VALUE overrides pass on")
  points = _selected(expand(path, arg), only)
  check_overrides(path, points[0].arg, overrides)
  failed = []
  for point in points:
    workdir = os.path.join(root, point.name)
    cmd = command(path, point, root, overrides, main_module)
    if dry_run:
      print(" ".join(shlex.quote(c) for c in cmd))
      continue
    done = os.path.join(workdir, DONE)
    if os.path.exists(done):
      print(f"skip {point.name}: finished ({done} exists; delete it to rerun)", flush=True)
      continue
    print(f"run {point.name}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    start = time.time()
    rc, signalled = _call_passing_signals(cmd, env)
    if rc == preemption.EXIT_PREEMPTED or signalled:
      raise Preempted(f"{point.name} was preempted (exit {rc}): rerun the sweep to resume")
    status = preemption.read_status(workdir) or {}
    if rc or status.get("state") != "finished":
      print(f"FAILED {point.name} (exit {rc}, run status {status.get('state')})", flush=True)
      failed.append(point.name)
      continue
    tmp = done + ".tmp"
    with open(tmp, "w") as f:
      json.dump({"command": cmd, "seconds": round(time.time() - start, 1)}, f, indent=2)
    os.replace(tmp, done)
  return failed


def _call_passing_signals(cmd: list[str], env: dict[str, str] | None) -> tuple[int, bool]:
  """Runs `cmd`; SIGTERM/SIGINT/SIGHUP to this script are passed on to it (it saves and
  exits 75) instead of killing it. Returns (exit status, whether this script got a signal)."""
  proc = subprocess.Popen(cmd, env=env)
  got: list[int] = []

  def forward(signum: int, frame: Any) -> None:
    del frame
    got.append(signum)
    if proc.poll() is None:
      proc.send_signal(signum)  # a second copy (a terminal's process group) is harmless

  old = {sig: signal.signal(sig, forward) for sig in preemption.SIGNALS}
  try:
    rc = proc.wait()
  finally:
    for sig, handler in old.items():
      signal.signal(sig, handler)
  return rc, bool(got)


def _parse(argv: list[str]) -> dict[str, Any]:
  """A small parser: --config.* overrides are not flags of this script (absl would reject
  them), so it is simpler than splitting them out before absl."""
  opts: dict[str, Any] = {"overrides": [], "dry_run": False, "only": None}
  for a in argv:
    if a.startswith("--config."):
      opts["overrides"].append(a)
    elif a in ("--dry_run", "--dry-run"):
      opts["dry_run"] = True
    elif a.startswith(("--experiment=", "--root=", "--only=")):
      k, v = a[2:].split("=", 1)
      opts[k] = v
    elif a in ("-h", "--help"):
      print(__doc__)
      sys.exit(0)
    else:
      raise ValueError(f"unknown argument {a!r}; see --help")
  for k in ("experiment", "root"):
    if not opts.get(k):
      raise ValueError(f"--{k} is required")
  return opts


def main(argv: list[str]) -> int:
  try:
    opts = _parse(argv)
    failed = run(opts["experiment"], opts["root"], opts["overrides"], opts["only"], opts["dry_run"])
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except Preempted as e:
    print(f"preempted: {e}", file=sys.stderr)
    return preemption.EXIT_PREEMPTED
  if failed:
    print(f"error: {len(failed)} point(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
