"""Preemption and restarts: the signals that save and stop a run, its exit status, the workdir
lock and the record of a finished run.

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

The status file and the lock go through etils.epath, so a gs:// workdir keeps them in the
bucket (see `WorkdirLock` for how the lock works without an exclusive create).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from bert_jax.runtime import files

# The exit status of a run stopped by SIGTERM/SIGINT/SIGHUP after saving its checkpoint: rerun
# the same command to resume (sysexits.h EX_TEMPFAIL). 0 means the run reached its last step.
EXIT_PREEMPTED = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Written by process 0 when a run ends normally (reached its last step) or after a preemption
# save; removed when a run starts, so it never describes an older run.
STATUS_FILE = "run_status.json"
LOCK_FILE = "bert_jax.lock"


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


# ----------------------------------------------------------------------------- lock


def process_start(pid: int) -> int | None:
  """When process `pid` (of this pid namespace) started, in clock ticks since boot (field 22 of
  /proc/<pid>/stat); None if it is gone or there is no /proc. A pid reused by another process
  has another start time."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      data = f.read()
    return int(data[data.rindex(b")") + 2 :].split()[19])  # the name may hold ") "
  except (OSError, ValueError, IndexError):
    return None


def _read_text(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read().strip() or None
  except OSError:
    return None


def _pid_namespace() -> str | None:
  try:
    return os.readlink("/proc/self/ns/pid")
  except OSError:
    return None


def _flock_held(path: str) -> bool | None:
  """Whether some process holds the flock of `path` (None: cannot tell). The kernel drops an
  flock when its holder dies, however it died and in whatever pid namespace it ran."""
  try:
    fd = os.open(path, os.O_RDWR)  # NFS emulates flock with fcntl locks: they need write access
  except OSError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    return True
  except OSError:
    return None
  finally:
    os.close(fd)  # our test lock goes with it
  return False


class ReadOnlyWorkdir(OSError):
  """The workdir's lock cannot be created: the workdir is read-only (or not ours to write).
  A trainer rerun on a finished run's read-only workdir has nothing to write and goes on
  without a lock (train.py); anything else stops on this one line."""


class WorkdirLock:
  """`<workdir>/bert_jax.lock`, held by process 0 for the whole run: a second trainer on the
  same workdir stops with one line naming the holder and how to clear it. A lock whose holder
  is dead is taken over, the holder told from a live one by more than its pid:

  - on this machine (same host name and boot id), the holder keeps an flock on the file, which
    the kernel drops when the holder dies however it died (SIGKILL, the OOM killer, its
    container stopped) and whatever pid namespace it ran in: a restarted container, whose
    trainer was pid 1 as it is again now, takes over its predecessor's lock;
  - where flock does not work (some cluster file systems), a holder in this pid namespace is
    alive iff its pid runs with the start time the lock records (a reused pid is another
    process);
  - a lock written by an older version (pid only) whose pid is gone is dead; one whose pid now
    belongs to some other process is dead once not refreshed for `STALE_S`;
  - another host's (whose processes cannot be checked) is dead once not refreshed for
    `STALE_S`; a live holder refreshes it every `HEARTBEAT_S`.

  Locally the lock is created with O_EXCL, so exactly one of two racing trainers gets it. An
  object store (gs://) has no exclusive create through etils.epath/gcsfs, so there the lock is
  a create-if-absent object write checked by reading it back: a trainer that finds no lock
  writes one with a random token, waits `SETTLE_S` and reads it again; of two trainers that
  both found none, the later write wins and the earlier writer reads the other's token and
  stops. The race stays open only if a write takes longer than `SETTLE_S` to become visible
  (GCS reads are strongly consistent after a write completes). Its refresh time is stored in
  the object (object mtimes are not portable across backends).
  """

  HEARTBEAT_S = 30.0
  STALE_S = 600.0
  SETTLE_S = 1.0

  def __init__(self, workdir: str):
    self.remote = files.is_remote(workdir)
    self.path = str(epath.Path(workdir, LOCK_FILE))
    self.held = False
    self._owner: dict[str, Any] = {}
    self._fd: int | None = None  # the open lock file, flocked while held (local)
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _heartbeat(self) -> None:
    while not self._stop.wait(self.HEARTBEAT_S):
      try:
        if self.remote:
          epath.Path(self.path).write_text(json.dumps({**self._owner, "time": time.time()}))
        else:
          os.utime(self.path)
      except Exception as e:  # the run goes on; a second trainer may take the lock in STALE_S
        logging.warning("Cannot refresh the workdir lock %s: %s", self.path, e)

  @staticmethod
  def _identity() -> dict[str, Any]:
    """Who holds a lock: host and pid, plus what tells a live holder from a dead one."""
    return {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "token": uuid.uuid4().hex,
      "boot": _read_text("/proc/sys/kernel/random/boot_id"),
      "pidns": _pid_namespace(),
      "start": process_start(os.getpid()),
    }

  def _try_create(self, owner: dict) -> bool:
    if self.remote:
      lock = epath.Path(self.path)
      if lock.exists():
        return False
      lock.write_text(json.dumps({**owner, "time": time.time()}))
      time.sleep(self.SETTLE_S)  # a racing trainer's write lands meanwhile
      try:
        return json.loads(lock.read_text()).get("token") == owner["token"]
      except (FileNotFoundError, json.JSONDecodeError):
        return False
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    except OSError as e:
      error = ReadOnlyWorkdir if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else OSError
      raise error(f"cannot create the lock {self.path}: {e.strerror or e}") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      owner["flock"] = True
    except OSError:  # a file system without flock: the pid and its start time tell instead
      owner["flock"] = False
    data = json.dumps(owner).encode()
    while data:
      data = data[os.write(fd, data) :]
    self._fd = fd
    return True

  def _read(self) -> tuple[dict, float]:
    """(the holder's record, seconds since it was refreshed); FileNotFoundError if gone."""
    if self.remote:
      text = epath.Path(self.path).read_text()
      age = lambda other: time.time() - float(other.get("time", 0.0))
    else:
      with open(self.path) as f:
        text = f.read()
      mtime = os.path.getmtime(self.path)
      age = lambda other: time.time() - mtime
    try:
      other = json.loads(text)
    except json.JSONDecodeError:
      other = {}
    return other, age(other)

  def _holder(self, other: dict, age: float, me: dict) -> tuple[bool, str]:
    """(whether the lock's holder is alive, the error line if it is, else why it is dead)."""
    workdir = os.path.dirname(self.path)
    pid = other.get("pid")
    here = other.get("host") == me["host"] and isinstance(pid, int)
    same_boot = here and me["boot"] is not None and other.get("boot") == me["boot"]
    stop = (
      "stop it first (SIGTERM saves and exits; its lock goes with it; a dead trainer's lock is "
      f"taken over by itself), or delete {self.path} if you are sure no trainer of it runs"
    )
    if same_boot and other.get("pidns") == me["pidns"] and other.get("start") is not None:
      if process_start(pid) == other["start"]:
        return (
          True,
          f"{workdir} is in use by another trainer (pid {pid} on this host, {self.path}): {stop}",
        )
      return False, f"its pid {pid} is gone or now another process's"
    if same_boot and other.get("flock") and not self.remote:
      held = _flock_held(self.path)
      if held:
        return True, (
          f"{workdir} is in use by another trainer (pid {pid} on this host, in another "
          f"container or pid namespace; {self.path}): {stop}"
        )
      if held is False:
        return False, f"its holder (pid {pid} of another pid namespace) is gone"
    if here and "start" not in other and not files.process_alive(pid):
      return False, f"its pid {pid} is gone"  # a lock of an older version: the pid alone
    if age < self.STALE_S:
      where = "this host" if here else f"host {other.get('host')}"
      return True, (
        f"{workdir} is in use by a trainer on {where} (pid {pid}, lock refreshed {age:.0f} s "
        f"ago; taken over after {self.STALE_S:.0f} s without refresh, or delete {self.path} if "
        "that run is dead)"
      )
    return False, f"not refreshed for {age:.0f} s"

  def acquire(self) -> None:
    import jax

    error = ""
    if jax.process_index() == 0:
      try:
        error = self._acquire_here()
      except OSError as e:
        if jax.process_count() == 1:
          raise
        error = str(e)  # every process stops with it
    if jax.process_count() > 1:
      # Every process stops with the same line instead of waiting on process 0's collectives.
      from jax.experimental import multihost_utils

      code = np.frombuffer(error.encode().ljust(1024)[:1024], np.uint8)
      code = multihost_utils.broadcast_one_to_all(code)
      error = bytes(np.asarray(code)).decode(errors="replace").rstrip()
    if error:
      raise OSError(error)

  def _acquire_here(self) -> str:
    me = self._identity()
    for _ in range(3):
      with files.uninterrupted():  # a file created is a lock held and refreshed
        created = self._try_create(dict(me))
        if created:
          self.held, self._owner = True, me
          self._thread = threading.Thread(target=self._heartbeat, daemon=True, name="lock")
          self._thread.start()
      if created:
        return ""
      try:
        other, age = self._read()
      except FileNotFoundError:
        continue  # released meanwhile
      if not other:
        # Being written right now, or left empty by a crash between create and write (an
        # object store writes whole objects: there an unreadable lock has no time, so goes).
        if age > 10:
          self._remove()
        time.sleep(0.1)
        continue
      alive, why = self._holder(other, age, me)
      if alive:
        return why
      logging.warning("Taking over the lock %s of a dead trainer: %s", self.path, why)
      self._remove()
    return f"cannot take the lock {self.path}: it keeps changing (another trainer starting?)"

  def _remove(self) -> None:
    epath.Path(self.path).unlink(missing_ok=True)

  def release(self) -> None:
    """Gives the lock up. Never raises: a run that fails because its workdir became unwritable
    reports that, not the lock it could not remove (the next run takes a dead holder's over)."""
    if not self.held:
      return
    self.held = False
    self._stop.set()
    if self._thread is not None and self._thread.ident is not None:  # started
      self._thread.join()
    try:
      if self.remote:
        # Not a lock another trainer took over after a lost refresh.
        try:
          if json.loads(epath.Path(self.path).read_text()).get("token") != self._owner["token"]:
            return
        except (FileNotFoundError, json.JSONDecodeError):
          return
        self._remove()
      elif self._fd is not None:
        with contextlib.suppress(FileNotFoundError):
          if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:  # still ours
            os.unlink(self.path)
    except Exception as e:  # noqa: BLE001 -- the run's own error (if any) is the one to report
      logging.warning("Cannot remove the workdir lock %s: %s", self.path, e)
    finally:
      if self._fd is not None:
        os.close(self._fd)  # drops the flock
        self._fd = None

  def __enter__(self) -> WorkdirLock:
    try:
      self.acquire()
    except BaseException:
      # A signal while taking the lock (Preempted, before training): `with` will not call
      # __exit__, so the lock this process may already hold goes here.
      self.release()
      raise
    return self

  def __exit__(self, *exc: Any) -> None:
    self.release()
