"""The workdir lock: one run per workdir at a time, across processes, hosts and restarts.

`WorkdirLock(workdir)` is taken by the trainer and by fine-tuning before they write anything
(`WorkdirLock` says how a holder is recognised, alive or gone). It goes through etils.epath, so
a gs:// workdir keeps it in the bucket, without an exclusive create.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from bert_jax.runtime import files

LOCK_FILE = "bert_jax.lock"


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
