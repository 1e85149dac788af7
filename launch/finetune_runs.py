"""launch/sweep.py's fine-tuning runs: a point's downstream suite (its experiment's
`finetune_suite`), each run's command, and the key that lets --reuse link a run of a row of its
own (the no-pretraining control) between experiments. Loaded beside sweep.py."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
from typing import Any

DONE = "sweep_done.json"  # a finished run's record in its workdir
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = "results.json"  # what bert_jax.finetune writes last, once every seed is done


def check_keys(config: Any, overrides: list[str], where: str) -> None:
  for o in overrides:
    key = o.split("=", 1)[0][len("--config.") :]
    node = config
    for part in key.split("."):
      if not hasattr(node, "keys") or part not in node:
        raise ValueError(f"{o.split('=', 1)[0]}: no such key in the config of {where}")
      node = node[part]


FINETUNE_CONFIG = os.path.join(REPO, "configs", "finetune.py")


def check_finetune_overrides(
  runs: list[FinetuneRun], overrides: list[str], config_path: str = FINETUNE_CONFIG
) -> None:
  """Every fine-tuning run's --config.* names a key of its task's config, checked before any
  pretraining starts (a typo would otherwise fail hours later)."""
  spec = importlib.util.spec_from_file_location("sweep_finetune_config", config_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  configs: dict[str, Any] = {}
  for r in runs:
    if r.task not in configs:
      configs[r.task] = module.get_config(r.task)
    check_keys(configs[r.task], [*r.overrides, *overrides], f"{config_path}:{r.task}")


@dataclasses.dataclass(frozen=True)
class FinetuneRun:
  point: str  # the pretraining point whose checkpoint (<root>/<point>) it starts from
  task: str  # a preset of configs/finetune.py
  row: str  # its report row: the point's name, or the suite's own (e.g. task=ltr_bilstm)
  overrides: tuple[str, ...]  # --config.KEY=VALUE for bert_jax.finetune ({point}: its workdir)
  # False: the suite sets config.init itself (the no-pretraining control: init=''), so the
  # point's checkpoint is not passed; the point only lends its files ({point}/tokenizer/...).
  from_point: bool = True

  def workdir(self, root: str) -> str:
    return os.path.join(root, self.row, "finetune", self.task)


def finetune_runs(module: Any, path: str, point: Any) -> list[FinetuneRun]:
  """The point's downstream suite: the experiment `module`'s `finetune_suite(point.arg)`,
  checked (`path`: its file)."""
  if not callable(getattr(module, "finetune_suite", None)):
    return []
  # Experiment files share their suite through the `experiments` package of their checkout.
  repo = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if repo not in sys.path:
    sys.path.insert(0, repo)
  runs = []
  for i, r in enumerate(module.finetune_suite(point.arg)):
    where = f"{path}: finetune_suite({point.arg!r}) run {i}"
    if not isinstance(r, dict) or not isinstance(r.get("task"), str):
      raise ValueError(f"{where}: expected a dict with a task name, got {r!r}")
    unknown = set(r) - {"task", "overrides", "row"}
    if unknown:
      raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    row = ",".join(f"{k}={str(v)}" for k, v in r.get("row", {}).items()) or point.name
    overrides = r.get("overrides", {})
    from_point = "init" not in overrides
    if not from_point and row == point.name:
      raise ValueError(f"{where}: a run with its own init needs a row of its own")
    flags_ = tuple(f"--config.{k}={str(v)}" for k, v in overrides.items())
    runs.append(FinetuneRun(point.name, r["task"], row, flags_, from_point))
  seen = [(r.row, r.task) for r in runs]
  if len(set(seen)) != len(seen):
    raise ValueError(f"{path}: finetune_suite({point.arg!r}) lists a task twice for one row")
  return runs


def finetune_command(
  run: FinetuneRun,
  root: str,
  overrides: list[str] = (),
  finetune_module: str = "bert_jax.finetune",
) -> list[str]:
  point_dir = os.path.join(root, run.point)
  init = [f"--config.init={point_dir}"] if run.from_point else []
  return [
    sys.executable,
    "-m",
    finetune_module,
    f"--config={FINETUNE_CONFIG}:{run.task}",
    *init,
    f"--workdir={run.workdir(root)}",
    *(o.replace("{point}", point_dir) for o in run.overrides),
    *overrides,
  ]


def finetune_key(run: FinetuneRun, root: str, overrides: list[str]) -> str | None:
  """What decides a run that does not start from its point's checkpoint (the control): its
  task, its flags as written, and the content of the point's files it names ({point}/...: a
  file, or every file of a directory).
  None for a run from the point's checkpoint (that is reused with its point)."""
  if run.from_point:
    return None
  h = hashlib.sha256(json.dumps([run.task, list(run.overrides), sorted(overrides)]).encode())
  for o in run.overrides:
    if "{point}" in o:
      path = o.split("=", 1)[1].replace("{point}", os.path.join(root, run.point))
      if not os.path.exists(path):  # the run itself will say so
        continue
      names = sorted(os.listdir(path)) if os.path.isdir(path) else [""]
      for name in names:
        with open(os.path.join(path, name) if name else path, "rb") as f:
          h.update(name.encode() + hashlib.sha256(f.read()).digest())
  return h.hexdigest()


def reuse_run(key: str, run: FinetuneRun, root: str, roots: list[str]) -> str | None:
  """Links a row-of-its-own run's workdir to a finished run of the same key under `roots`."""
  workdir = run.workdir(root)
  if os.path.lexists(workdir) or os.path.exists(os.path.join(workdir, DONE)):
    return None
  for other in roots:
    if link_if_same(key, run.workdir(other), workdir):
      return run.workdir(other)
  return None


def link_if_same(key: str, found: str, workdir: str) -> bool:
  """Links `workdir` to `found` when `found` finished (DONE) with the same key."""
  try:
    with open(os.path.join(found, DONE)) as f:
      same = json.load(f).get("key") == key
  except (OSError, ValueError):
    return False
  if not same or os.path.realpath(found) == os.path.realpath(workdir):
    return False
  os.makedirs(os.path.dirname(os.path.abspath(workdir)), exist_ok=True)
  os.symlink(os.path.realpath(found), workdir)
  return True
