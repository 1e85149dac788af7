"""The training loop that pretraining (train.py) and fine-tuning (finetune.py) both run.

A run hands the loop a `Job`: the jitted step, its host batches, and the few things that differ
between pretraining and fine-tuning (what a window of step metrics adds to the train row, what an
eval does, what a checkpoint holds). The loop owns what must be the same everywhere:

- dispatch step t, then read step t-1's metrics, so the device never waits on the host;
- the guarded update's policy: a step whose update is non-finite changed nothing on the device
  (`optim.apply_update`); the loop stops the run naming the step (`opt.nonfinite='stop'`), or
  counts it and goes on (`'skip'`) until `opt.max_consecutive_skips` in a row end the run;
- one log window: `metrics.jsonl` + TensorBoard rows `train` (loss, grad_norm, learning_rate,
  skipped_steps, and the job's own fields) and `perf` (steps, examples and tokens per second,
  MFU where the peak is known), and one progress line;
- eval and checkpoint cadence, the checkpoint holding the open log window so a resumed run logs
  exactly what an uninterrupted one would;
- preemption: every process stops and saves at the same step (preemption.Preemption).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
from absl import logging
from etils import epath

from bert_jax import sharding
from bert_jax.runtime import files
from bert_jax.runtime import preemption as preemption_lib

# ----------------------------------------------------------------------------- console


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


def format_metrics(values: dict[str, float]) -> str:
  return " | ".join(f"{k} {v:.4f}" for k, v in values.items())


class Eta:
  """Time left at the steady step rate. The first step of a run (and of a resumed run) holds
  the compile, minutes on an accelerator, so the rate is measured from the end of that step,
  over the last `window` progress lines (an eval's pause drops out again)."""

  def __init__(self, total_steps: int, window: int = 10):
    self.total_steps = total_steps
    self.points: collections.deque[tuple[int, float]] = collections.deque(maxlen=window + 1)

  def mark(self, step: int, now: float) -> None:
    """Step `step` had finished at time `now` (the first mark: the step that compiled)."""
    if not self.points or step > self.points[-1][0]:
      self.points.append((step, now))

  def text(self) -> str:
    """'ETA 2m28s', or 'ETA measuring' until a step after the first has been timed."""
    if len(self.points) < 2:
      return "ETA measuring"
    (s0, t0), (s1, t1) = self.points[0], self.points[-1]
    return f"ETA {format_duration((self.total_steps - s1) * (t1 - t0) / (s1 - s0))}"


# ----------------------------------------------------------------------------- metric log


# A metrics.jsonl row is a few hundred bytes: a longer "line" is not the run's log.
MAX_ROW_BYTES = 1 << 20


def check_log_paths(workdir: str) -> None:
  """One line, before a run changes anything in `workdir`, when its metrics.jsonl is not a
  regular file (a directory, a link to /dev/full) or its tb is not a directory."""
  if files.is_remote(workdir):
    return
  files.check_regular_file(os.path.join(workdir, "metrics.jsonl"), "the run's metrics log")
  tb = os.path.join(workdir, "tb")
  if os.path.lexists(tb) and not os.path.isdir(tb):
    raise OSError(f"{tb} is {files.kind_of(tb)}, not the run's TensorBoard directory: move it away")


def repair_metrics_log(path: str, resume_step: int) -> None:
  """Makes `path` (metrics.jsonl) the history up to `resume_step`: the rows a killed run wrote
  after its last checkpoint are replayed exactly by the resumed run, so they go; a torn last
  line (a kill or a full disk during the append) goes with a warning. Read a row at a time
  (a row over MAX_ROW_BYTES is an error), rewritten atomically; a path that is not a regular
  file is one line."""
  files.check_regular_file(path, "the run's metrics log")
  kept = []
  torn = None  # (line number, error) of a line that is not JSON: fine only if it is the last
  try:
    with epath.Path(path).open("rb") as f:
      for i, raw in enumerate(iter(lambda: f.readline(MAX_ROW_BYTES + 1), b""), 1):
        if len(raw) > MAX_ROW_BYTES:
          raise ValueError(f"{path}:{i} is not a JSON row (over {MAX_ROW_BYTES} bytes)")
        line = raw.decode("utf-8", errors="replace").strip()
        if not line:
          continue
        if torn is not None:
          raise ValueError(
            f"{path}:{torn[0]} is not a JSON row ({torn[1]}); fix or remove that line"
          )
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          torn = (i, e)
          continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
          raise ValueError(f"{path}:{i} is not a row of this log (no step): fix or remove it")
        if row["step"] <= resume_step:
          kept.append(line + "\n")
  except FileNotFoundError:
    return
  if torn is not None:
    logging.warning("%s: removed a torn last line (line %d)", path, torn[0])
  files.write_atomic(path, "".join(kept))


class MetricLogger:
  """metrics.jsonl + TensorBoard (process 0 only).

  On an object store (gs://; no append) metrics.jsonl is kept in memory and rewritten whole at
  every row, an all-or-nothing object write (a few MB even for long runs); TensorBoard writes
  its event files to a local temporary directory that is copied to `<workdir>/tb` at most every
  `TB_SYNC_S` and at close (tensorboardX itself reaches gs:// only through tensorflow).
  """

  TB_SYNC_S = 60.0

  def __init__(self, workdir: str, resume_step: int):
    self.enabled = jax.process_index() == 0
    self.path = str(epath.Path(workdir, "metrics.jsonl"))
    self.remote = files.is_remote(workdir)
    self.tb = None
    if not self.enabled:
      return
    check_log_paths(workdir)
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
      files.write_atomic(self.path, self._text + json.dumps(row) + "\n")
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


@contextlib.contextmanager
def closing(*closables: Any) -> Iterator[None]:
  """Closes each of `closables` (a checkpointer, a logger) after the block. When the block
  failed, that error is the one raised: a close failing for the same reason (an unwritable
  workdir) is only logged, instead of replacing the error that names the cause."""
  try:
    yield
  except BaseException:
    for c in closables:
      try:
        c.close()
      except Exception as e:  # noqa: BLE001 -- the block's own error is reported
        logging.warning("while stopping: %s", " ".join(str(e).split())[:400])
    raise
  for c in closables:
    c.close()


# ----------------------------------------------------------------------------- the loop

# Keys of a step's metrics that the loop reads itself; every other key is a sum that the log
# window adds up and hands to `Job.summarize`.
LOOP_KEYS = ("loss", "grad_norm", "nonfinite")


@dataclasses.dataclass
class Job:
  """One training run for `run`: what differs between pretraining and fine-tuning.

  `step_fn(state, batch, rng) -> (state, metrics)` is the jitted step (`sharding.jit_step`);
  its metrics hold `loss` (this step's), `grad_norm`, `nonfinite` (1.0 when the guarded update
  skipped the step) and sums for `summarize`. `batches` yields this process's rows of each
  global batch. `evaluate(step, state)` runs at every `eval_every` steps and at the last
  (it logs and prints its own results); `save(step, state, window)` writes a checkpoint at every
  `ckpt_every` steps, the last, and a preemption, holding `window` (the open log window).
  `preemption` is entered by the caller before anything else of the run, so a signal while
  data is built or a checkpoint restored stops the run too.
  """

  step_fn: Callable[..., Any]
  batches: Iterator[dict[str, Any]]
  preemption: preemption_lib.Preemption  # entered by the caller around the whole run
  mesh: Any
  rng: Any
  total_steps: int
  logger: MetricLogger
  learning_rate: Callable[[int], float]  # the schedule's value at a 0-based step
  evaluate: Callable[[int, Any], None]
  save: Callable[[int, Any, dict[str, float]], None]
  log_every: int
  eval_every: int  # 0: only at the last step
  ckpt_every: int
  examples_per_step: int  # the global batch size
  nonfinite: str = "stop"  # 'stop' | 'skip'
  max_consecutive_skips: int = 10
  summarize: Callable[[dict[str, float]], dict[str, float]] = lambda sums: {}
  describe: Callable[[int, dict[str, float]], str] = lambda step, summary: ""  # progress extras
  label: str = ""  # names the run in messages (a fine-tuning seed)
  flops_per_step: float = 0.0  # model FLOPs of one step, for MFU
  peak_flops: float = 0.0  # peak FLOP/s of all devices together; 0 = unknown
  clock: Callable[[], float] = time.perf_counter  # seconds, for the rates and the ETA


class EvalInterrupted(Exception):
  """Raised by a job's `evaluate` between eval batches when `Preemption.interrupts()`: the
  loop saves the step with its eval marked pending, and the resumed run evaluates it first."""


@dataclasses.dataclass
class Result:
  state: Any
  step: int
  preempted: bool  # a signal stopped the run before its last step, after saving
  train: dict[str, float]  # the last train row


class _Window:
  """The log window: sums of the steps since the last train row. Its dict form is what a
  checkpoint stores, so a resumed run continues the same window."""

  def __init__(self, saved: dict[str, float] | None):
    self.sums = dict(saved or {})

  def add(self, key: str, value: float) -> None:
    self.sums[key] = self.sums.get(key, 0.0) + float(value)

  def get(self, key: str) -> float:
    return self.sums.get(key, 0.0)

  def state(self) -> dict[str, float]:
    return dict(self.sums)


def run(job: Job, state: Any, start_step: int, window: dict[str, float] | None = None) -> Result:
  """Trains from `start_step` to `job.total_steps` (or until a preemption has saved). `window`
  is the open log window a checkpoint held ({} for a new run)."""
  w = _Window(window)
  # Reserved window keys (the loop's own bookkeeping, beside the step metrics' sums).
  steps_k, skipped_k, streak_k = "_steps", "_skipped", "_skip_streak"
  loss_k, gnorm_k, tokens_k = "_loss_sum", "_grad_norm_sum", "_tokens"
  last_train: dict[str, float] = {}
  window_start = job.clock()
  eta = Eta(job.total_steps)
  who = f"{job.label}: " if job.label else ""

  def consume(step: int, metrics: Any, tokens: int) -> None:
    """The host side of a finished step: the non-finite policy and the log window."""
    nonlocal window_start, last_train
    m = jax.device_get(metrics)
    loss = float(m["loss"])
    if m["nonfinite"] or not math.isfinite(loss):
      if job.nonfinite != "skip":
        raise FloatingPointError(
          f"{who}non-finite update at step {step} (loss {loss}, gradient norm "
          f"{float(m['grad_norm'])}); stopped without applying it (--config.opt.nonfinite=skip "
          "skips such steps)"
        )
      w.add(skipped_k, 1)
      w.add(streak_k, 1)
      logging.warning("%snon-finite update at step %d (loss %s): skipped", who, step, loss)
      if w.get(streak_k) >= job.max_consecutive_skips:
        raise FloatingPointError(
          f"{who}{int(w.get(streak_k))} steps in a row up to step {step} had a non-finite "
          "update and were skipped: the run is not training (lower opt.lr, check the data; "
          "opt.max_consecutive_skips sets the limit)"
        )
    else:
      w.sums[streak_k] = 0.0
      w.add(loss_k, loss)
      w.add(gnorm_k, m["grad_norm"])
      for k, v in m.items():
        if k not in LOOP_KEYS:
          w.add(k, v)
    w.add(steps_k, 1)
    w.add(tokens_k, tokens)
    if not eta.points:
      eta.mark(step, job.clock())  # the step that compiled has finished
    if step % job.log_every and step != job.total_steps:
      return
    applied = w.get(steps_k) - w.get(skipped_k)
    sums = {k: v for k, v in w.sums.items() if not k.startswith("_")}
    summary = {
      "loss": w.get(loss_k) / applied if applied else math.nan,
      **job.summarize(sums),
      "grad_norm": w.get(gnorm_k) / applied if applied else math.nan,
      "learning_rate": float(job.learning_rate(step - 1)),
      "skipped_steps": w.get(skipped_k),
    }
    job.logger.write(step, "train", summary)
    now = job.clock()
    eta.mark(step, now)
    sps = w.get(steps_k) / max(now - window_start, 1e-9)
    perf = {
      "steps_per_sec": sps,
      "examples_per_sec": sps * job.examples_per_step,
      "tokens_per_sec": w.get(tokens_k) / max(now - window_start, 1e-9),
    }
    if job.peak_flops and job.flops_per_step:
      perf["mfu"] = sps * job.flops_per_step / job.peak_flops
    job.logger.write(step, "perf", perf)
    parts = [
      f"{progress_bar(step / job.total_steps)}{' ' + job.label if job.label else ''}",
      f"step {step}/{job.total_steps}",
      f"loss {summary['loss']:.4f}",
      job.describe(step, summary),
      f"{perf['examples_per_sec']:.1f} ex/s",
      f"{perf['tokens_per_sec']:.0f} tok/s",
      f"MFU {100 * perf['mfu']:.1f}%" if "mfu" in perf else "",
      f"skipped {int(summary['skipped_steps'])}" if summary["skipped_steps"] else "",
      eta.text(),
    ]
    console(" | ".join(p for p in parts if p))
    last_train = summary
    streak = w.get(streak_k)
    w.sums = {streak_k: streak} if streak else {}
    window_start = now

  step = start_step
  stop = False
  prev = None  # (step, metrics, tokens) dispatched last: read after dispatching the next
  preempt = job.preemption
  preempt.training()
  # An eval a signal cut short is the saved step's: done first, as it would have been.
  pending_k = "_eval_pending"
  if w.sums.pop(pending_k, 0.0):
    try:
      job.evaluate(step, state)
    except EvalInterrupted:  # the checkpoint of this step is saved (with the eval pending)
      return Result(state, step, True, last_train)
  eval_cut = False
  while step < job.total_steps and not stop:
    host_batch = next(job.batches)
    tokens = host_batch["input_ids"].size * jax.process_count()
    batch = sharding.to_global(host_batch, job.mesh)
    # The step's dispatch moves nothing between host and devices implicitly (big_vision's
    # guard): the batch went up explicitly above; the metrics come back in consume, by its
    # explicit device_get, one step late (the host side is outside the guard). Moves between
    # devices stay allowed: jit puts the step's key on the mesh.
    with (
      jax.transfer_guard_host_to_device("disallow"),
      jax.transfer_guard_device_to_host("disallow"),
    ):
      state, metrics = job.step_fn(state, batch, job.rng)
    step += 1
    if prev is not None:
      consume(*prev)
    prev = (step, metrics, tokens)
    stop = preempt.should_stop(step)  # the same step on every process
    last = step == job.total_steps
    eval_now = last or bool(job.eval_every and step % job.eval_every == 0)
    save_now = last or stop or step % job.ckpt_every == 0
    if eval_now or save_now:
      consume(*prev)  # the eval and the checkpoint follow this step's host side
      prev = None
    if eval_now and not stop:
      try:
        job.evaluate(step, state)
      except EvalInterrupted:
        stop = save_now = True
    eval_cut = eval_now and stop
    if save_now:
      job.save(step, state, {**w.state(), **({pending_k: 1.0} if eval_cut else {})})
  return Result(state, step, stop and (step < job.total_steps or eval_cut), last_train)
