"""Fault suite, preemption: real trainer subprocesses on real workdirs. SIGTERM, SIGINT and
SIGHUP save the current step and exit with the preemption status; a signal to one of two
processes makes both save the same step, and the rerun is bit-identical to an uninterrupted
run; a signal however often and whenever it comes (twice to each of two processes, in an eval,
in a checkpoint write, after the agreement, while process 0 builds the data) stops both
together; a signal while taking the workdir lock leaves none. (The lock itself:
test_runtime_workdir_lock.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bert_jax.runtime import preemption, workdir_lock
from unit.test_train import _env, _free_port, _rows


def _wait_for_step(proc, workdir, step, timeout=240):
  """Blocks until process 0 of the run in `workdir` has logged `step`."""
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if (workdir / "metrics.jsonl").exists() and any(r["step"] >= step for r in _rows(workdir)):
      return
    time.sleep(0.05)
  raise AssertionError(f"run ended or stalled before step {step}: {proc.poll()}")


def _status(workdir):
  with open(workdir / preemption.STATUS_FILE) as f:
    return json.load(f)


def default_cmd(workdir, *extra):
  """The bundled default (a vocab trained on the corpus, then its data), 2 steps."""
  from unit.test_train import ROOT

  return [
    sys.executable,
    "-m",
    "bert_jax.main",
    f"--config={ROOT / 'configs' / 'local.py'}:steps=2",
    f"--workdir={workdir}",
    "--config.log.fill_mask=()",
    "--config.eval.max_batches=1",
    *extra,
  ]


def test_a_signal_while_taking_the_lock_leaves_no_lock(tmp_path, monkeypatch):
  """SIGTERM landing the moment the lock file is created (before training, so the handler
  raises Preempted): the lock is released, not left behind for the rerun to find."""
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  create = lock._try_create

  def create_then_signal(owner):
    made = create(owner)
    os.kill(os.getpid(), signal.SIGTERM)
    return made

  monkeypatch.setattr(lock, "_try_create", create_then_signal)
  with preemption.Preemption(), pytest.raises(preemption.Preempted):
    with lock:
      pytest.fail("the signal must stop the run before its body")
  assert not (tmp_path / workdir_lock.LOCK_FILE).exists()


def test_repeated_signals_in_a_run_only_stop_it():
  """48: in a run, SIGTERM, SIGINT and SIGHUP however often are recorded and stop it at its
  next step, never raised and never the default action, even after other code swapped a
  handler in and back; the run gives the previous handlers back and forgets its signals."""
  before = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
  with preemption.Preemption() as run:
    run.training()
    old = signal.signal(signal.SIGTERM, lambda *a: None)  # a library's swap and restore
    signal.signal(signal.SIGTERM, old)
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
      os.kill(os.getpid(), sig)
    assert preemption.received() == [15, 15, 2, 1, 15]
    assert run.signal == signal.SIGTERM and run.should_stop(1)
  assert {sig: signal.getsignal(sig) for sig in preemption.SIGNALS} == before
  assert preemption.received() == []


TAKE_OVER = """
import os, signal, sys
from bert_jax.runtime import preemption
preemption.install(defer=True)
import jax
jax.distributed.initialize(
  coordinator_address="127.0.0.1:" + sys.argv[1], num_processes=1, process_id=0
)
jax_handler = preemption._sigaction(signal.SIGTERM).handler
assert jax_handler not in (0, 1, preemption._python_trip)  # JAX's notifier took SIGTERM
preemption.take_over_sigterm()
assert preemption._sigaction(signal.SIGTERM).handler == preemption._python_trip
old = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a library's swap and restore (the data
signal.signal(signal.SIGTERM, old)  # build's put SIG_DFL back under JAX's handler: issue 48)
for _ in range(3):
  os.kill(os.getpid(), signal.SIGTERM)
print("received", preemption.received(), flush=True)
import time
time.sleep(1.5)  # JAX's notifier looks every second
jax.distributed.shutdown()
"""


def test_jax_notifier_is_kept_and_told_of_every_signal():
  """48: after jax.distributed.initialize (whose preemption notifier puts a C handler on
  SIGTERM), our handler is put back on SIGTERM and calls JAX's: three SIGTERMs, after a
  library swapped a handler in and back, are all recorded, JAX's notifier hears of them, and
  the process lives on to exit 0."""
  r = subprocess.run(
    [sys.executable, "-c", TAKE_OVER, str(_free_port())],
    env=_env(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip() == "received [15, 15, 15]"
  assert "SIGTERM caught at" in r.stderr  # JAX's notifier (preemption_notifier.cc)


# ----------------------------------------------------------------------------- 48: at any moment


def _running(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return False
  return stat[stat.rindex(")") + 2] != "Z"


def _children(pid):
  """The pids whose parent is `pid` (from /proc)."""
  out = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat") as f:
          stat = f.read()
      except OSError:
        continue
      if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
        out.append(int(name))
  return out


@pytest.mark.parametrize(
  "sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)], ids=lambda s: s.name
)
def test_signal_while_the_data_workers_start_stops_at_once(tmp_path, sig):
  """46.6: the bundled default signalled while its data build starts its worker processes
  (SIGINT to the process group, as Ctrl-C; SIGTERM to the trainer): exit 75 within seconds
  (no wait on a worker or a lock), one line, no traceback of the trainer or a worker, the
  workers gone, the lock released, nothing half-built."""
  wd = tmp_path / "wd"
  proc = subprocess.Popen(
    default_cmd(wd),
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
  )
  deadline = time.time() + 240
  workers = []
  while time.time() < deadline and proc.poll() is None:
    data = wd / "data"
    building = data.is_dir() and any(p.name.startswith(".create_data-") for p in data.iterdir())
    workers = _children(proc.pid)
    if building and len(workers) >= 2:  # the resource tracker and a worker (or two)
      break
    time.sleep(0.005)
  assert len(workers) >= 2, (proc.poll(), workers)
  if sig == signal.SIGINT:
    os.killpg(proc.pid, sig)
  else:
    proc.send_signal(sig)
  try:
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == preemption.EXIT_PREEMPTED, err[-3000:]
  assert "Traceback" not in err and "EOFError" not in err, err[-3000:]
  assert err.strip().splitlines()[-1] == (
    f"{sig.name} received before training started: stopped, nothing to save; rerun the same "
    "command to resume"
  )
  deadline = time.time() + 30
  while any(map(_running, workers)) and time.time() < deadline:
    time.sleep(0.1)
  assert not any(map(_running, workers)), workers
  assert not (wd / workdir_lock.LOCK_FILE).exists()
  assert not (wd / "checkpoints").exists()
  if (wd / "data").exists():  # either not begun or whole, never a half-built dataset
    assert not [p.name for p in (wd / "data").iterdir() if p.name.startswith(".")]
