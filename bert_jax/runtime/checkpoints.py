"""orbax checkpoints: train state, data-iterator state and metadata; restore on any mesh.

Layout: `<workdir>/checkpoints/<step>/{params, opt_state, data, meta}`. `params` is its own
item so a notebook (or `init_from`) can restore the weights alone, onto one CPU device or any
mesh, without the optimizer moments. `meta` is JSON: the step, the resolved config, the
BertConfig and the tokenizer fingerprint -- never pickled, never evaluated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging as py_logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax import model_config
from bert_jax.runtime import files

T = TypeVar("T")
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


def checkpoint_dir(path: str | os.PathLike) -> str:
  """Accepts a workdir, its checkpoints/ dir, or one step dir; returns the manager dir."""
  p = files.as_path(path)
  if (p / "checkpoints").is_dir():
    return str(p / "checkpoints")
  return str(p)


def _split_step_dir(path: str) -> tuple[str, int | None]:
  p = epath.Path(path)
  if p.name.isdigit() and (p / "meta").is_dir():
    return str(p.parent), int(p.name)
  return path, None


def _verbose() -> bool:
  return py_logging.getLogger("absl").getEffectiveLevel() <= py_logging.INFO


class _OrbaxTracebacks(py_logging.Filter):
  """orbax logs each failed background write with its traceback before the error reaches
  `Checkpointer`, which raises it as one line: keep orbax's one-line messages, and their
  tracebacks only when logging is verbose (`--verbosity=0`). Its two warnings per read-only
  manager (that it is read-only) are dropped unless verbose."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    if "/orbax/" in record.pathname and not _verbose():
      if record.exc_info:
        record.exc_info = record.exc_text = None
      # Every read-only manager (each restore, read_meta, all_steps) warns that it is one.
      if _READ_ONLY_NOTICES.search(str(record.msg)):
        return False
    return True


_READ_ONLY_NOTICES = re.compile(r"Given directory is read only|read_only=True, setting")


def _storage_leftover(error: BaseException | None, obj: Any = None) -> bool:
  """Whether `error` comes from an orbax/TensorStore read or write still in flight when a
  restore or save failed (the failure itself is reported once, by this module)."""
  code = getattr(obj, "cr_code", None)  # a coroutine garbage-collected with its exception
  if code is not None and ("/orbax/" in code.co_filename or "/tensorstore/" in code.co_filename):
    return True
  if isinstance(error, RuntimeError) and "Event loop is closed" in str(error):
    return True  # its event loop was shut down by the failed operation
  if error is not None and ocp.utils.TMP_DIR_SUFFIX in str(error):
    return True  # a TensorStore write into a save's temporary directory (no orbax frame)
  tb = getattr(error, "__traceback__", None)
  while tb is not None:
    if "/orbax/" in tb.tb_frame.f_code.co_filename:
      return True
    tb = tb.tb_next
  return False


class _StorageLeftovers(py_logging.Filter):
  """asyncio logs "Task exception was never retrieved" / "Event loop is closed" for each of
  those leftovers: dropped unless logging is verbose."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return _verbose() or not (_storage_leftover(error) or "Event loop is closed" in str(record.msg))


def _unraisable_hook(previous: Callable) -> Callable:
  """Python prints "Exception ignored in: <coroutine ...>" and a traceback with the whole
  TensorStore spec (hundreds of lines) for each leftover at exit: dropped unless verbose."""

  def hook(unraisable: Any) -> None:
    if _verbose() or not _storage_leftover(unraisable.exc_value, unraisable.object):
      previous(unraisable)

  return hook


py_logging.getLogger("absl").addFilter(_OrbaxTracebacks())
py_logging.getLogger("asyncio").addFilter(_StorageLeftovers())
sys.unraisablehook = _unraisable_hook(sys.unraisablehook)


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
    if keep < 1 or every_steps < 1:  # orbax would keep no checkpoint, or divide by zero
      raise ValueError(
        f"a Checkpointer keeps >= 1 steps every >= 1 steps, not keep={keep}, every={every_steps}"
      )
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
        # `<step>.orbax-checkpoint-tmp-*` dirs of a save that a kill or a full disk cut short.
        cleanup_tmp_directories=not read_only,
      ),
    )
    # JAX's preemption sync points are the loop's (preemption.Preemption counts them alike on
    # every process): orbax's own calls, with step numbers and from its finalize thread too,
    # would put another count into the agreement (a stop agreed for a count never reached).
    self.mngr.reached_preemption = lambda step: False

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
    with self._write_errors():
      return self.mngr.save(step, args=ocp.args.Composite(**items), force=force)

  @contextlib.contextmanager
  def _write_errors(self):
    """A failed write (disk full, permissions; an async one surfaces at the next save or at
    close) becomes one OSError naming the directory, and its temporary directory goes."""
    try:
      yield
    except Exception as e:  # TensorStore reports I/O errors as ValueError and others
      if jax.process_index() == 0:
        for tmp in epath.Path(self.directory).glob("*" + ocp.utils.TMP_DIR_SUFFIX + "*"):
          with contextlib.suppress(OSError):
            tmp.rmtree()
      reason = files.root_cause(e)[:400]
      # TensorStore ends an OS error with [os_error_code='28']: say it as strerror does.
      if m := re.search(r"os_error_code='?(\d+)", files.root_cause(e)):
        reason = f"{os.strerror(int(m.group(1)))} (errno {m.group(1)})"
      raise OSError(f"cannot write a checkpoint in {self.directory}: {reason}") from e

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
      restore_data_iterator(str(epath.Path(self.directory) / str(step) / "data"), data_iter)
    state = {"step": r.opt_state["step"], "params": r.params, "opt_state": r.opt_state["opt_state"]}
    return state, r.meta

  def restore_latest(
    self,
    abstract_state: dict,
    data_iter: Any = None,
    check: Callable[[dict], None] | None = None,
  ) -> tuple[int, dict, dict] | None:
    """(step, state, meta) of the newest checkpoint that restores, or None when there is none.

    A checkpoint that fails to restore (truncated or corrupt file, missing item) is reported
    in one warning and moved to `<checkpoints>.unreadable/<step>`, so that training on from an
    older one can save that step again; none is moved unless an older one restores. `check(meta)`
    runs before the weights are read: its errors (a user's config mismatch) are not corruption
    and propagate. If no checkpoint restores, one line names the directory.
    """
    steps = sorted(self.mngr.all_steps(), reverse=True)
    unreadable: list[int] = []
    for step in steps:
      error = None
      try:
        meta = self.meta(step)
      except Exception as e:  # orbax/TensorStore raise many types for missing/corrupt files
        error = e
      if error is None and check is not None:
        check(meta)
      if error is None:
        try:
          state, meta = self.restore(step, abstract_state, data_iter)
        except Exception as e:
          error = e
      # Every process must fall back to the same step (a shard can be corrupt on one host only).
      if _all_processes(error is None):
        if unreadable:
          self._move_unreadable(unreadable)
        return step, state, meta
      _warn_unreadable(
        self.directory, step, error or RuntimeError("failed on another process"), steps
      )
      unreadable.append(step)
    if steps:
      raise ValueError(
        f"no checkpoint in {self.directory} restores (steps {', '.join(map(str, steps))}; "
        "see the warnings above): move the directory away to train from scratch"
      )
    return None

  def meta(self, step: int) -> dict:
    """The JSON metadata of one step alone (cheap: no arrays are read)."""
    meta = self.mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
      raise ValueError(f"meta is not a {FORMAT} record")
    return meta

  def _move_unreadable(self, steps: list[int]) -> None:
    aside = epath.Path(self.directory.rstrip("/") + ".unreadable")
    if jax.process_index() == 0:
      aside.mkdir(parents=True, exist_ok=True)
      for step in steps:
        dst = aside / str(step)
        if dst.exists():
          dst.rmtree()
        # On an object store a "rename" copies and deletes: slow for big steps, but only
        # ever done for a step that failed to restore.
        (epath.Path(self.directory) / str(step)).rename(dst)
        logging.warning("moved the unreadable checkpoint %s/%d to %s", self.directory, step, dst)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("bert_jax:unreadable_moved")
    self.mngr.reload()

  def wait(self) -> None:
    with self._write_errors():
      self.mngr.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self.mngr.close()


def _warn_unreadable(directory: str, step: int, error: BaseException, steps: list[int]) -> None:
  older = [s for s in steps if s < step]
  then = f"trying step {older[0]}" if older else "no older checkpoint"
  logging.warning(
    "checkpoint %s/%d does not restore (%s); %s",
    directory,
    step,
    files.root_cause(error)[:400],
    then,
  )


def _all_processes(ok: bool) -> bool:
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils

  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def all_steps(path: str | os.PathLike) -> list[int]:
  """The committed steps of a workdir or checkpoints dir, oldest first."""
  directory = checkpoint_dir(path)
  if not epath.Path(directory).is_dir():
    raise FileNotFoundError(f"no checkpoint directory at {directory}")
  mngr = ocp.CheckpointManager(
    directory, options=ocp.CheckpointManagerOptions(read_only=True, create=False)
  )
  try:
    return sorted(mngr.all_steps())
  finally:
    mngr.close()


class WorkdirError(ValueError):
  """What every step of a workdir shares is wrong (its tokenizer) or not what was asked for
  (its architecture): no checkpoint is to blame and an older step would fail alike, so
  `load_newest` raises it at once."""


def load_newest(path: str | os.PathLike, load: Callable[[int], T]) -> T:
  """`load(step)` of the newest step under the workdir `path` that loads. Read-only
  `restore_latest`: each step that fails is named in one warning with the reason and the one
  before is tried; if none loads, one line names the directory (ValueError). A WorkdirError
  is raised as it is."""
  steps = sorted(all_steps(path), reverse=True)
  directory = checkpoint_dir(path)
  for step in steps:
    try:
      return load(step)
    except WorkdirError:
      raise
    except Exception as e:  # orbax/TensorStore raise many types for missing/corrupt files
      _warn_unreadable(directory, step, e, steps)
  if not steps:
    raise ValueError(f"{directory} holds no checkpoint")
  raise ValueError(
    f"no checkpoint in {directory} restores (steps {', '.join(map(str, steps))}; see the "
    "warnings above)"
  )


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
    state = files.read_json(own)
  else:
    saved = sorted(d.glob("process_*-of-*.json"))
    if not saved:
      raise ValueError(f"{d} holds no data-iterator state")
    states = [files.read_json(f) for f in saved]
    if any(s != states[0] for s in states):
      raise ValueError(
        f"{d}: the data-iterator states saved by {len(saved)} processes differ, so they cannot "
        f"be mapped onto {count} processes; resume with the old process count"
      )
    state = states[0]
  data_iter.set_state(state)
  data_iter.start_prefetch()


def read_meta(path: str, step: int | None = None) -> tuple[dict, int, str]:
  """(meta JSON, step, manager dir) of the latest (or given) checkpoint under `path`."""
  directory, step_in_path = _split_step_dir(checkpoint_dir(path))
  step = step if step is not None else step_in_path
  if not epath.Path(directory).is_dir():
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


def bert_config_from_meta(meta: dict, **overrides: Any) -> model_config.BertConfig:
  """The stored BertConfig; fields this version does not have (older or newer ones) are
  ignored and values it no longer has read as their current ones (`model_config.RETIRED`), so
  checkpoints move between versions."""
  fields = {f.name for f in dataclasses.fields(model_config.BertConfig)}
  stored = {k: v for k, v in meta["model"].items() if k in fields}
  return model_config.BertConfig(**model_config.retired_to_current({**stored, **overrides}))


def check_architecture(
  stored: model_config.BertConfig, want: model_config.BertConfig, source: str
) -> None:
  """One line naming every shape field in which a checkpoint (`stored`) differs from `want`."""
  diffs = [
    f"{k}={getattr(stored, k)} (checkpoint) vs {getattr(want, k)} (config)"
    for k in SHAPE_FIELDS
    if getattr(stored, k) != getattr(want, k)
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
