"""orbax checkpoints: train state, data-iterator state and metadata; restore on any mesh.

Layout: `<workdir>/checkpoints/<step>/{params, opt_state, data, meta}`. `params` is its own
item so a notebook (or `init_from`) can restore the weights alone, onto one CPU device or any
mesh, without the optimizer moments. `meta` is JSON: the step, the resolved config, the
BertConfig and the tokenizer fingerprint -- never pickled, never evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import model as model_lib

FORMAT = "bert_jax/1"
# BertConfig fields that change parameter shapes: two checkpoints are the same architecture
# iff these agree (dtypes, dropout, layer layout, remat and kernels do not matter for loading).
SHAPE_FIELDS = (
  "vocab_size",
  "hidden_size",
  "num_layers",
  "num_heads",
  "intermediate_size",
  "max_position_embeddings",
  "type_vocab_size",
)


def checkpoint_dir(path: str) -> str:
  """Accepts a workdir, its checkpoints/ dir, or one step dir; returns the manager dir."""
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return os.path.join(path, "checkpoints")
  return path


def _split_step_dir(path: str) -> tuple[str, int | None]:
  base = os.path.basename(path.rstrip("/"))
  if base.isdigit() and os.path.isdir(os.path.join(path, "meta")):
    return os.path.dirname(path.rstrip("/")), int(base)
  return path, None


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager with the items bert_jax saves."""

  def __init__(
    self,
    directory: str,
    *,
    keep: int = 2,
    every_steps: int = 1000,
    async_save: bool = True,
    read_only: bool = False,
  ):
    self.directory = checkpoint_dir(directory)
    self.mngr = ocp.CheckpointManager(
      self.directory,
      item_names=("params", "opt_state", "data", "meta"),
      options=ocp.CheckpointManagerOptions(
        enable_async_checkpointing=async_save,
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(every_steps),
        read_only=read_only,
        create=not read_only,
      ),
    )

  def latest_step(self) -> int | None:
    return self.mngr.latest_step()

  def save(self, step: int, state: dict, data_iter: Any, meta: dict, force: bool = False) -> bool:
    items = {
      "params": ocp.args.StandardSave(state["params"]),
      "opt_state": ocp.args.StandardSave({"step": state["step"], "opt_state": state["opt_state"]}),
      "meta": ocp.args.JsonSave({**meta, "step": int(step), "format": FORMAT}),
    }
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    return self.mngr.save(step, args=ocp.args.Composite(**items), force=force)

  def restore(self, step: int, abstract_state: dict, data_iter: Any = None) -> tuple[dict, dict]:
    """Restores the full train state onto the shardings carried by `abstract_state`."""
    items = {
      "params": ocp.args.StandardRestore(abstract_state["params"]),
      "opt_state": ocp.args.StandardRestore(
        {"step": abstract_state["step"], "opt_state": abstract_state["opt_state"]}
      ),
      "meta": ocp.args.JsonRestore(),
    }
    r = self.mngr.restore(step, args=ocp.args.Composite(**items))
    if data_iter is not None:
      restore_data_iterator(os.path.join(self.directory, str(step), "data"), data_iter)
    state = {"step": r.opt_state["step"], "params": r.params, "opt_state": r.opt_state["opt_state"]}
    return state, r.meta

  def meta(self, step: int) -> dict:
    """The JSON metadata of one step alone (cheap: no arrays are read)."""
    return self.mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def wait(self) -> None:
    self.mngr.wait_until_finished()

  def close(self) -> None:
    self.mngr.wait_until_finished()
    self.mngr.close()


def restore_data_iterator(directory: str, data_iter: Any) -> None:
  """Sets `data_iter` to the state grain saved in `directory` (a step's `data` item).

  grain saves one file per process and looks only for its own. The training iterator's state
  counts global batches (input_pipeline), so every process saved the same state and any one of
  them resumes a run with another process count (same global batch): 1 x 8 devices -> 2 x 4.
  """
  d = epath.Path(directory)
  index, count = jax.process_index(), jax.process_count()
  own = d / f"process_{index}-of-{count}.json"
  if own.exists():
    state = json.loads(own.read_text())
  else:
    files = sorted(d.glob("process_*-of-*.json"))
    if not files:
      raise ValueError(f"{d} holds no data-iterator state")
    states = [json.loads(f.read_text()) for f in files]
    if any(s != states[0] for s in states):
      raise ValueError(
        f"{d}: the data-iterator states saved by {len(files)} processes differ, so they cannot "
        f"be mapped onto {count} processes; resume with the old process count"
      )
    state = states[0]
  data_iter.set_state(state)
  data_iter.start_prefetch()


def read_meta(path: str, step: int | None = None) -> tuple[dict, int, str]:
  """(meta JSON, step, manager dir) of the latest (or given) checkpoint under `path`."""
  directory, step_in_path = _split_step_dir(checkpoint_dir(path))
  step = step if step is not None else step_in_path
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"no checkpoint directory at {directory}")
  mngr = ocp.CheckpointManager(
    directory,
    item_names=("meta",),
    options=ocp.CheckpointManagerOptions(read_only=True, create=False),
  )
  steps = sorted(mngr.all_steps())
  if not steps:
    mngr.close()
    raise FileNotFoundError(f"no checkpoint found under {directory}")
  step = steps[-1] if step is None else step
  if step not in steps:
    mngr.close()
    have = ", ".join(map(str, steps))
    raise FileNotFoundError(f"{directory}: no checkpoint at step {step} (steps: {have})")
  try:
    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  except Exception as e:  # orbax raises many types for missing/corrupt items
    raise ValueError(f"cannot read checkpoint metadata at {directory}/{step}: {e}") from None
  finally:
    mngr.close()
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise ValueError(f"{directory}/{step} is not a bert_jax checkpoint (format {FORMAT})")
  return meta, step, directory


def bert_config_from_meta(meta: dict, **overrides: Any) -> model_lib.BertConfig:
  """The stored BertConfig; fields this version does not have (older or newer ones) are
  ignored, so checkpoints move between versions."""
  fields = {f.name for f in dataclasses.fields(model_lib.BertConfig)}
  stored = {k: v for k, v in meta["model"].items() if k in fields}
  return model_lib.BertConfig(**{**stored, **overrides})


def check_same_architecture(meta: dict, cfg: model_lib.BertConfig, source: str) -> None:
  """One-line error when a checkpoint's parameter shapes differ from `cfg`'s."""
  diffs = [
    f"{k}={meta['model'].get(k)} (checkpoint) vs {getattr(cfg, k)} (config)"
    for k in SHAPE_FIELDS
    if meta["model"].get(k) != getattr(cfg, k)
  ]
  if diffs:
    raise ValueError(f"checkpoint {source} is another architecture: {'; '.join(diffs)}")


def restore_params(path: str, abstract_params: Any, step: int | None = None) -> tuple[Any, dict]:
  """Restores only the weights onto the shardings in `abstract_params` (ShapeDtypeStructs).

  Works on any mesh and in a plain single-device process; `init_from` and `bert_jax.load`
  use it. Architecture is checked against the stored BertConfig first.
  """
  meta, step, directory = read_meta(path, step)
  mngr = ocp.CheckpointManager(
    directory,
    item_names=("params",),
    options=ocp.CheckpointManagerOptions(read_only=True, create=False),
  )
  try:
    r = mngr.restore(
      step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params))
    )
  finally:
    mngr.close()
  return r.params, meta


def single_device_target(abstract: Any, device: Any = None) -> Any:
  device = device or jax.devices()[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), abstract)


def to_json(obj: Any) -> Any:
  """A config dict as plain JSON (tuples become lists; numpy scalars become Python)."""
  return json.loads(
    json.dumps(obj, default=lambda o: o.item() if isinstance(o, np.generic) else str(o))
  )
