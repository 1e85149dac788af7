"""Preemption and restarts: the signals that save and stop a run, its exit status and the record
of a finished run (the workdir lock: runtime/workdir_lock.py).

SIGTERM (TPU/GCE preemption, SLURM, `kill`), SIGINT (Ctrl-C) and SIGHUP (an ssh drop) make the
trainer finish its current step, save a checkpoint at that step and exit with `EXIT_PREEMPTED`
(75, EX_TEMPFAIL: "preempted, rerun the same command to resume"). On several processes the
signal may reach one host only, or every host, once or several times (a scheduler and a batch
script both passing it on); all processes must still save the same step, or one host would
enter the checkpoint save while another runs the next step's collectives. JAX's distributed
runtime provides that agreement (`multihost_utils.reached_preemption_sync_point`): its
preemption notifier (a C handler that `jax.distributed.initialize` puts on SIGTERM) propagates
the notice to every process through the coordination service, which names one step, the same
everywhere, at which all save.

One Python handler catches the three signals for the whole life of a command (`install`, the
first thing an entry point does; `Preemption` installs it for its run otherwise), however often
they come: a signal is recorded, never the default action (which would kill process 0 and with
it the coordination service, aborting every other process: issue 48). With JAX's preemption
service it calls JAX's notifier itself (`take_over_sigterm`: JAX's handler is kept by address
and ours put back on SIGTERM), so Python code that swaps a handler and restores it cannot put
the default action back under JAX, and the process knows of every signal: before training one
process stops at once (`Preempted`: nothing to save); several stop together at their first
agreement, or where process 0 builds the data (`stoppable`); during training, an eval, a
checkpoint write, or after the agreement, a signal only confirms the stop. No handler writes
to a stream (a handler runs between any two bytecodes, possibly inside a write of the same
stream): the lines are printed where the stop is acted on.

The status file goes through etils.epath, so a gs:// workdir keeps it in the bucket.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from etils import epath

from bert_jax.runtime import files

# The exit status of a run stopped by SIGTERM/SIGINT/SIGHUP after saving its checkpoint: rerun
# the same command to resume (sysexits.h EX_TEMPFAIL). 0 means the run reached its last step.
EXIT_PREEMPTED = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Written by process 0 when a run ends normally (reached its last step) or after a preemption
# save; removed when a run starts, so it never describes an older run.
STATUS_FILE = "run_status.json"


def _sync_manager() -> Any:
  """JAX's preemption sync manager when this is a multi-process run that has one."""
  import jax
  from jax._src import distributed

  if jax.process_count() == 1:
    return None
  return distributed.global_state.preemption_sync_manager


# Sync points this process has passed (`Preemption._agree`): JAX's preemption service needs
# every process to count them alike, from the first, whatever runs them (seeds, grid points).
_sync_points = 0


class Preempted(SystemExit):
  """A signal stopped the run before it trained a step (while it built data, trained a vocab
  or restored): there was nothing new to save, so it stops at once, with `EXIT_PREEMPTED`
  (rerun to resume). A SystemExit, so that no `except Exception` on the way swallows it, while
  every `with` on the way (the workdir lock) still closes. `line()` is what to print."""

  def __init__(self, message: str):
    super().__init__(EXIT_PREEMPTED)
    self.message = message

  def line(self) -> str:
    return f"{self.message}; rerun the same command to resume"


# ----------------------------------------------------------------------------- the handler

_received: list[int] = []  # every signal caught, in order (more than one: a repeated signal)
_run: Preemption | None = None  # the run they stop, while one is entered
_ran = False  # a run has ended: a signal after it only is recorded (the command is ending)
_defer = False  # a multi-process job: a signal before its run waits for the run's agreement
_previous: dict[int, Any] | None = None  # the handlers `_install` replaced; None: not installed
_python_trip: int | None = None  # the address of CPython's own C signal handler
_jax_notify: Callable[[], None] | None = None  # calls JAX's SIGTERM handler (its notifier)
_jax_saved: Any = None  # JAX's `struct sigaction` for SIGTERM, to put back (`_uninstall`)
_jax_left = False  # JAX's handler could not be taken over here: SIGTERM stays its own

_SA_SIGINFO = 4  # Linux


class _Sigaction(ctypes.Structure):
  """glibc's `struct sigaction` on x86-64 and aarch64 Linux."""

  _fields_ = [
    ("handler", ctypes.c_void_p),
    ("mask", ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))),
    ("flags", ctypes.c_int),
    ("restorer", ctypes.c_void_p),
  ]


def _sigaction(sig: int, new: _Sigaction | None = None) -> _Sigaction | None:
  """The C-level action of `sig` (setting `new` if given); None where it cannot be read (not
  glibc on x86-64/aarch64 Linux: JAX's handler is then left in place, `_jax_left`)."""
  if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
    return None
  try:
    libc = ctypes.CDLL(None, use_errno=True)
  except OSError:
    return None
  old = _Sigaction()
  if libc.sigaction(sig, ctypes.byref(new) if new is not None else None, ctypes.byref(old)):
    return None
  return old


def _on_signal(signum: int, frame: Any) -> None:
  """The handler of SIGTERM, SIGINT and SIGHUP: records the signal and passes it on; raises
  `Preempted` (through `files.interrupt`) only where the stop is at once (see the module
  docstring), and only for the first signal, so a repeated one never cuts the clean-up."""
  del frame
  _received.append(signum)
  if _jax_notify is not None:
    _jax_notify()  # JAX's notifier: sets its flag, however often
  elif _jax_left and signum != signal.SIGTERM:
    os.kill(os.getpid(), signal.SIGTERM)  # to JAX's own handler
  run = _run
  if run is not None:
    run._on_signal(signum)
  elif len(_received) == 1 and not _defer and not _ran:
    files.interrupt(Preempted(f"{signal.Signals(signum).name} {_BEFORE}"))


_BEFORE = "received before training started: stopped, nothing to save"


def _install() -> bool:
  """Puts `_on_signal` on the three signals (False where this is not the main thread)."""
  global _previous, _python_trip
  previous = {}
  try:
    for sig in SIGNALS:
      previous[sig] = signal.signal(sig, _on_signal)
  except ValueError:  # not the main thread: signals keep their actions
    for sig, old in previous.items():
      signal.signal(sig, old)
    return False
  _previous = previous
  if _python_trip is None:
    action = _sigaction(signal.SIGTERM)
    _python_trip = action.handler if action is not None else None
  return True


def _uninstall() -> None:
  """Puts back what `_install` replaced, JAX's C handler on SIGTERM included."""
  global _previous, _jax_notify, _jax_saved
  if _previous is None:
    return
  for sig, old in _previous.items():
    signal.signal(sig, old)
  if _jax_saved is not None:
    _sigaction(signal.SIGTERM, _jax_saved)
  _previous, _jax_notify, _jax_saved = None, None, None


def install(defer: bool = False) -> None:
  """Catches SIGTERM, SIGINT and SIGHUP for the rest of this process: the first thing an entry
  point does, so a signal at any moment, however often, has a handler. Until a run starts, a
  signal stops a one-process command at once (`Preempted`); with `defer` (a multi-process job,
  whose processes must stop together) it is kept for the run's first agreement. Call it again
  (from the main thread) to change `defer`; `take_over_sigterm` after
  `jax.distributed.initialize`."""
  global _defer
  _defer = defer
  if _previous is None:
    _install()  # for good: no run puts the previous handlers back
  take_over_sigterm()


def take_over_sigterm() -> None:
  """After `jax.distributed.initialize` (whose preemption notifier puts a C handler on
  SIGTERM): keeps JAX's handler by address, calls it for every signal from now on (and for
  those already received) and puts ours back on SIGTERM. Where C handlers cannot be read,
  SIGTERM stays JAX's and SIGINT/SIGHUP are passed on to it as SIGTERM."""
  global _jax_notify, _jax_saved, _jax_left
  if _previous is None or _jax_notify is not None or _jax_left:
    return
  from jax._src import distributed  # (no backend is started: this may run before initialize)

  action = _sigaction(signal.SIGTERM)
  if action is None:
    _jax_left = distributed.global_state.preemption_sync_manager is not None
    return
  address = action.handler or 0
  if address in (0, 1) or address == _python_trip:  # SIG_DFL, SIG_IGN, or ours: no JAX here
    return
  saved = _Sigaction()
  ctypes.pointer(saved)[0] = action
  if action.flags & _SA_SIGINFO:
    handler = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(address)
    notify = lambda: handler(signal.SIGTERM, None, None)  # noqa: E731
  else:
    handler1 = ctypes.CFUNCTYPE(None, ctypes.c_int)(address)
    notify = lambda: handler1(signal.SIGTERM)  # noqa: E731
  signal.signal(signal.SIGTERM, _on_signal)
  _jax_notify, _jax_saved = notify, saved
  if _received:
    notify()


def received() -> list[int]:
  """The signals this process has caught so far, in order."""
  return list(_received)


def exiting() -> None:
  """The command is about to exit with its status decided: from now on the three signals are
  ignored (at interpreter shutdown CPython puts the default action back on signals that have a
  Python handler, and a late SIGTERM would then turn exit 75 or 0 into a kill)."""
  for sig in SIGNALS:
    with contextlib.suppress(ValueError):
      signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
  """A section that a signal cuts at once even in a multi-process run (process 0 building the
  data while the others wait for it): `Preempted` is raised in it, and on entering it when a
  signal came before; the caller then makes every process stop together. Outside a run (no
  `Preemption` entered) it changes nothing."""
  run = _run
  if run is None:
    yield
    return
  if run.signal is not None and not run._training:
    raise Preempted(f"{signal.Signals(run.signal).name} {_BEFORE}")
  run._stoppable = True
  try:
    yield
  finally:
    run._stoppable = False


class Preemption:
  """Context manager over a whole run: `should_stop(step)`, called once per step by every
  process, is True at the same step on all processes once any of them got SIGTERM, SIGINT or
  SIGHUP. A signal that comes before the training loop starts (`training()`) raises
  `Preempted` at once in a one-process run; with several processes it is kept for the loop's
  first step, where all of them agree to stop (stopping one process early would leave the
  others waiting in a collective), unless it comes in a `stoppable` section."""

  def __init__(self):
    import jax

    self.signal: int | None = None  # the first signal this process received, if any
    self._multi = jax.process_count() > 1
    self._training = False
    self._stoppable = False
    self._own = False  # installed the handler for this run only
    self._said = False

  def __enter__(self) -> Preemption:
    global _run
    if _previous is None:  # a library call (no `install`): the handler is this run's alone
      self._own = _install()
      _received.clear()
    take_over_sigterm()
    _run = self
    if _received:  # the process was told to stop before this run began
      self.signal = _received[0]
      if not self._multi:
        self.__exit__()
        raise Preempted(f"{signal.Signals(self.signal).name} {_BEFORE}")
    return self

  def training(self) -> None:
    """From now on a signal saves the current step and stops (the loop has started)."""
    self._training = True

  def _on_signal(self, signum: int) -> None:
    first = self.signal is None
    if first:
      self.signal = signum
    if first and (self._stoppable or (not self._training and not self._multi)):
      files.interrupt(Preempted(f"{signal.Signals(signum).name} {_BEFORE}"))

  def _agree(self) -> bool:
    """Whether to stop here: the same answer on every process (collective when there are
    several). Every call is a sync point of JAX's preemption service, numbered in order."""
    from jax.experimental import multihost_utils

    global _sync_points
    _sync_points += 1
    if _sync_manager() is not None:
      return multihost_utils.reached_preemption_sync_point(_sync_points)
    if self._multi:  # the preemption service is disabled: agree through an allgather
      return bool(np.any(multihost_utils.process_allgather(np.int32(self.signal is not None))))
    return self.signal is not None

  def _say(self, what: str) -> None:
    """One plain line per process of a multi-process run (a one-process run says it all in its
    last line: "Preempted: saved step N")."""
    import jax

    if not self._multi or self._said:
      return
    self._said = True
    why = f"{signal.Signals(self.signal).name} here" if self.signal else "a signal to another"
    i, n = jax.process_index(), jax.process_count()
    print(f"process {i} of {n} ({why}): {what}", file=sys.stderr, flush=True)

  def should_stop(self, step: int) -> bool:
    """Whether to save `step` and stop; collective when there are several processes."""
    stop = self._agree()
    if stop:
      self._say(f"all processes save step {step} and exit")
    return stop

  def interrupts(self) -> bool:
    """Whether to abandon the eval under way (asked between its batches, on every process
    alike): a signal is acted on within one eval batch, not after a whole dev or test set."""
    stop = self._agree()
    if stop:
      self._say("all processes stop the eval, save its step and exit")
    return stop

  def __exit__(self, *exc: Any) -> None:
    global _run, _ran
    _run = None
    _ran = True
    if self._own:  # its signals were its own: a later run in this process starts afresh
      _uninstall()
      _received.clear()
      self._own = False


# ----------------------------------------------------------------------------- run status


def clear_status(workdir: str) -> None:
  """Forgets the previous run's ending (process 0, at start)."""
  import jax

  if jax.process_index() == 0:
    epath.Path(workdir, STATUS_FILE).unlink(missing_ok=True)


def write_status(
  workdir: str, step: int, total_steps: int, preempted: bool, state: str | None = None
) -> None:
  """Records how the run ended (`state`: finished, preempted, stopped, or as given, e.g.
  peer_lost); `launch/sweep.py` reads it to decide a point is finished."""
  import jax

  if jax.process_index() != 0:
    return
  if state is None:
    state = "preempted" if preempted else ("finished" if step >= total_steps else "stopped")
  record = {"state": state, "step": int(step), "total_steps": int(total_steps)}
  files.write_atomic(str(epath.Path(workdir, STATUS_FILE)), json.dumps(record))


def read_status(workdir: str) -> dict | None:
  """The last run's record in `workdir`, or None (still running, killed, or never run)."""
  try:
    return json.loads(epath.Path(workdir, STATUS_FILE).read_text())
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def run_command(run: Callable[[], None]) -> None:
  """A trainer's command line (`run`, e.g. `cli.run(main, ...)`) under the handler from its
  first line: a signal never finds the default action, and a stop before training ends in
  its one line (`Preempted.line`), exit 75."""
  install()
  try:
    run()
  except Preempted as e:
    print(e.line(), file=sys.stderr, flush=True)
    raise
  finally:
    exiting()
