"""bert_jax.runtime.workdir_lock: one trainer per workdir. A live holder is refused in one line
saying how to clear it (another process, another pid namespace, another host); a dead one's lock
is taken over (SIGKILLed, pid 1 of a gone namespace, a reused pid, an old unrefreshed record);
the holder keeps its lock fresh; on gs:// one of two racers wins."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from bert_jax.runtime import workdir_lock
from unit import test_runtime_files as unit_runtime_files
from unit.test_train import _env

# Shared fixtures (tests/unit/test_runtime_files.py).
gcs = unit_runtime_files.gcs


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_ones(tmp_path):
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  path = tmp_path / workdir_lock.LOCK_FILE
  # An older version's lock (pid only) of a running pid, refreshed just now: it may be live.
  path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid()}))
  with pytest.raises(OSError, match=f"in use by a trainer on this host \\(pid {os.getppid()}, l"):
    lock.acquire()
  path.write_text(json.dumps({"host": "tpu-7", "pid": 12}))
  with pytest.raises(OSError, match=r"in use by a trainer on host tpu-7 \(pid 12, lock refreshed"):
    lock.acquire()
  # Another host's lock that nobody refreshed for STALE_S is a dead run's: taken over.
  old = time.time() - lock.STALE_S - 5
  os.utime(path, (old, old))
  lock.HEARTBEAT_S = 0.05
  with lock:
    assert json.loads(path.read_text())["pid"] == os.getpid()
    os.utime(path, (old, old))
    time.sleep(0.5)
    assert time.time() - path.stat().st_mtime < 5  # the holder keeps its lock fresh
  assert not path.exists()


def _new_pid_namespace():
  """The command prefix that runs a command as pid 1 of a new pid namespace, killed with it (a
  container's trainer, as `docker run` starts it), or None where that needs root we lack."""
  cmd = ["unshare", "--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc"]
  if os.geteuid() != 0 or not shutil.which("unshare"):
    return None
  return cmd if subprocess.run([*cmd, "true"], capture_output=True).returncode == 0 else None


def _wait_until_gone(lock_path, timeout=60):
  """Until the kernel has dropped the flock of a SIGKILLed holder (its exit takes a moment
  after its parent's)."""
  deadline = time.time() + timeout
  while workdir_lock._flock_held(str(lock_path)) and time.time() < deadline:
    time.sleep(0.05)


HOLD = (
  "import sys; from bert_jax.runtime import workdir_lock; "
  "lock = workdir_lock.WorkdirLock(sys.argv[1]); "
  "lock.acquire(); print('held', flush=True); sys.stdin.read()"
)


def test_lock_tells_live_holders_from_dead_ones(tmp_path):
  """37.2: by more than a pid. A live trainer (another process; in another pid namespace too,
  where root may make one) is refused with a line saying how to clear it, and taken over once
  SIGKILLed; a lock naming pid 1 of a namespace that is gone, a pid now another process's
  (another start time) and an older version's 2-hour-old lock of a running pid are dead."""
  path = tmp_path / workdir_lock.LOCK_FILE
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  for prefix in filter(None, ([], _new_pid_namespace())):
    holder = subprocess.Popen(
      [*prefix, sys.executable, "-c", HOLD, str(tmp_path)],
      env=_env(),
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
    )
    assert holder.stdout.readline() == "held\n"
    pid = json.loads(path.read_text())["pid"]
    where = f"pid {pid} on this host" + (
      ", in another container or pid namespace;" if prefix else ","
    )
    with pytest.raises(OSError) as e:
      lock.acquire()
    assert str(e.value) == (
      f"{tmp_path} is in use by another trainer ({where} {path}): stop it first (SIGTERM saves "
      "and exits; its lock goes with it; a dead trainer's lock is taken over by itself), or "
      f"delete {path} if you are sure no trainer of it runs"
    )
    holder.kill()  # (unshare's --kill-child passes it on to the holder)
    holder.wait()
    _wait_until_gone(path)
    with lock:  # SIGKILLed: its lock is a dead trainer's
      assert json.loads(path.read_text())["token"] == lock._owner["token"]
    assert not path.exists()

  me = workdir_lock.WorkdirLock._identity()
  dead = {
    # pid 1 (of a container that is gone): its namespace's, not ours; nobody holds the flock
    "container": {**me, "pid": 1, "pidns": "pid:[1]", "start": 1, "flock": True},
    # our parent's pid, reused: its process started at another time
    "reused pid": {
      **me,
      "pid": os.getppid(),
      "start": workdir_lock.process_start(os.getppid()) + 1,
    },
    # an older version's record (pid only) of a running pid, not refreshed for 2 hours
    "stale": {"host": me["host"], "pid": os.getppid()},
  }
  for name, record in dead.items():
    path.write_text(json.dumps(record))
    if name == "stale":
      old = time.time() - 7200
      os.utime(path, (old, old))
    with lock:
      assert json.loads(path.read_text())["pid"] == os.getpid(), name
    assert not path.exists()


def test_lock_on_gs(gcs):
  path = gcs / "bucket" / "wd" / workdir_lock.LOCK_FILE
  a, b = workdir_lock.WorkdirLock("gs://bucket/wd"), workdir_lock.WorkdirLock("gs://bucket/wd")
  a.SETTLE_S = b.SETTLE_S = 0.0
  with a:
    assert json.loads(path.read_text())["pid"] == os.getpid()
    with pytest.raises(OSError, match=r"^gs://bucket/wd is in use by another trainer \(pid"):
      b.acquire()
  assert not path.exists()
  # Another host's lock not refreshed for STALE_S (the time is in the object): taken over.
  path.write_text(json.dumps({"host": "tpu-7", "pid": 12, "token": "x", "time": 0.0}))
  with b:
    assert json.loads(path.read_text())["pid"] == os.getpid()
  path.write_text("")  # not a lock being written (objects appear whole): a broken one
  with b:
    assert json.loads(path.read_text())["pid"] == os.getpid()
  path.write_text(json.dumps({"host": "tpu-7", "pid": 12, "token": "x", "time": 1e12}))
  with pytest.raises(OSError, match=r"in use by a trainer on host tpu-7 \(pid 12"):
    a.acquire()


def test_lock_on_gs_race_has_one_winner(gcs, monkeypatch):
  """Both trainers find no lock and write theirs; the later write wins, the earlier writer
  reads the other's token back and stops."""
  path = gcs / "bucket" / "wd" / workdir_lock.LOCK_FILE
  a = workdir_lock.WorkdirLock("gs://bucket/wd")

  def b_writes_meanwhile(seconds):  # a's settle wait, when b (which found no lock either) writes
    path.write_text(json.dumps({"host": "tpu-7", "pid": 12, "token": "b", "time": time.time()}))

  monkeypatch.setattr(workdir_lock.time, "sleep", b_writes_meanwhile)
  with pytest.raises(OSError, match=r"in use by a trainer on host tpu-7 \(pid 12"):
    a.acquire()
  assert json.loads(path.read_text())["token"] == "b"
