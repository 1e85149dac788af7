"""Fault suite, preemption: real trainer subprocesses on real workdirs. SIGTERM, SIGINT and
SIGHUP save the current step and exit with the preemption status; a signal to one of two
processes makes both save the same step, and the rerun is bit-identical to an uninterrupted
run; a signal however often and whenever it comes (twice to each of two processes, in an eval,
in a checkpoint write, after the agreement, while process 0 builds the data) stops both
together; a second trainer on a workdir is refused; a dead trainer's lock does not block."""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from test_train import _env, _free_port, _main_cmd, _params, _rows

from bert_jax.data import pretraining as pretraining_data
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.runtime import preemption


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


@pytest.mark.parametrize(
  "sig",
  [
    pytest.param(signal.SIGINT, marks=pytest.mark.slow),
    pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
    signal.SIGTERM,
  ],
  ids=lambda s: s.name,
)
def test_signal_saves_the_current_step_and_exits_preempted(tiny_data_dir, tmp_path, sig):
  wd = tmp_path / "wd"
  proc = subprocess.Popen(
    _main_cmd(wd, tiny_data_dir, 500),
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  _wait_for_step(proc, wd, 3)
  if sig == signal.SIGTERM:
    # A second trainer on the same workdir stops with one line and leaves the first alone.
    r = subprocess.run(
      _main_cmd(wd, tiny_data_dir, 500), env=_env(), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1
    lock = wd / preemption.LOCK_FILE
    assert r.stderr.strip().splitlines() == [
      f"main: error: {wd} is in use by another trainer (pid {proc.pid} on this host, {lock}): "
      "stop it first (SIGTERM saves and exits; its lock goes with it; a dead trainer's lock is "
      f"taken over by itself), or delete {lock} if you are sure no trainer of it runs"
    ]
    assert proc.poll() is None
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == preemption.EXIT_PREEMPTED, err[-2000:]
  saved = ckpt_lib.read_meta(str(wd))[1]
  assert 3 <= saved < 500
  assert saved == max(r["step"] for r in _rows(wd))  # the signal's step, not a multiple of 4
  # 46.9: one clean line says it (no absl-format lines about the signal before it).
  said = [ln for ln in (out + err).splitlines() if sig.name in ln or "reempt" in ln]
  assert said == [f"Preempted: saved step {saved}; rerun the same command to resume"], said
  assert _status(wd) == {"state": "preempted", "step": saved, "total_steps": 500}
  assert not (wd / preemption.LOCK_FILE).exists()


def test_stale_lock_of_a_dead_process_does_not_block(tiny_data_dir, tmp_path):
  wd = tmp_path / "wd"
  wd.mkdir()
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  (wd / preemption.LOCK_FILE).write_text(
    json.dumps({"host": socket.gethostname(), "pid": dead.pid})
  )
  r = subprocess.run(
    _main_cmd(wd, tiny_data_dir, 2), env=_env(), capture_output=True, text=True, timeout=240
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert _status(wd) == {"state": "finished", "step": 2, "total_steps": 2}
  assert not (wd / preemption.LOCK_FILE).exists()


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_ones(tmp_path):
  lock = preemption.WorkdirLock(str(tmp_path))
  path = tmp_path / preemption.LOCK_FILE
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


def _two_process_cmds(workdir, data_dir, steps, more=()):
  port = _free_port()
  extra = ["--num_cpu_devices=4", "--config.mesh.shape=(2,4,1)", "--distributed", *more]
  extra += [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2"]
  return [_main_cmd(workdir, data_dir, steps, [*extra, f"--process_id={i}"]) for i in range(2)]


def _start(cmds, env=None):
  return [
    subprocess.Popen(
      c, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for c in cmds
  ]


def _finish(procs, timeout=400):
  outs = [p.communicate(timeout=timeout) for p in procs]
  return [p.returncode for p in procs], [err for _, err in outs]


def _preempt_process_1(workdir, data_dir, steps, sig, env=None):
  """Runs 2 processes, sends `sig` to process 1 only (the host that writes no metrics) and
  checks that both stop at the same step, save it and exit with the preemption status."""
  procs = _start(_two_process_cmds(workdir, data_dir, steps), env)
  _wait_for_step(procs[0], workdir, 3)
  procs[1].send_signal(sig)
  rcs, errs = _finish(procs)
  assert rcs == [preemption.EXIT_PREEMPTED] * 2, errs[0][-2000:] + errs[1][-2000:]
  stops = [[ln for ln in e.splitlines() if "all processes save step" in ln] for e in errs]
  assert all(len(s) == 1 for s in stops), errs
  saved = ckpt_lib.read_meta(str(workdir))[1]
  assert all(s[0].endswith(f"all processes save step {saved} and exit") for s in stops)
  assert 3 <= saved < steps and saved == max(r["step"] for r in _rows(workdir))


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_saves_the_same_step_on_both(tiny_data_dir, tmp_path):
  """JAX's preemption sync; the rerun ends bit-identical to an uninterrupted 2-process run.
  (A step of 2 processes over Gloo takes about 0.6 s here: 16 steps leave the signal, sent
  after step 3, several seconds to land mid-run.)"""
  steps = 16
  ref = tmp_path / "ref"
  rcs, errs = _finish(_start(_two_process_cmds(ref, tiny_data_dir, steps)))
  assert rcs == [0, 0], errs[0][-2000:] + errs[1][-2000:]

  wd = tmp_path / "wd"
  _preempt_process_1(wd, tiny_data_dir, steps, signal.SIGTERM)
  rcs, errs = _finish(_start(_two_process_cmds(wd, tiny_data_dir, steps)))
  assert rcs == [0, 0], errs[0][-2000:] + errs[1][-2000:]
  step_a, pa = _params(wd)
  step_b, pb = _params(ref)
  assert step_a == step_b == steps
  for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
    np.testing.assert_array_equal(a, b)
  assert _rows(wd) == _rows(ref) and _rows(wd, "eval") == _rows(ref, "eval")


@pytest.mark.slow
@pytest.mark.parametrize(
  "sig, service",
  [(signal.SIGHUP, "true"), (signal.SIGTERM, "false")],
  ids=["SIGHUP-jax_sync", "SIGTERM-allgather"],
)
def test_other_signal_or_no_preemption_service_on_two_processes(
  tiny_data_dir, tmp_path, sig, service
):
  """SIGHUP (and SIGINT) take JAX's SIGTERM path; with JAX's preemption service disabled the
  processes agree through an allgather of a per-process flag."""
  env = _env(JAX_ENABLE_PREEMPTION_SERVICE=service)
  _preempt_process_1(tmp_path / "wd", tiny_data_dir, 16, sig, env)


def default_cmd(workdir, *extra):
  """The bundled default (a vocab trained on the corpus, then its data), 2 steps."""
  from test_train import ROOT

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


def test_signal_before_training_exits_preempted_and_releases_the_lock(tmp_path):
  """SIGTERM while the bundled default trains its vocab and builds its data: exit 75 at once,
  one line, the lock released, nothing half-built left; the rerun builds and trains."""
  wd = tmp_path / "wd"
  cmd = default_cmd(wd)
  proc = subprocess.Popen(
    cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  deadline = time.time() + 240
  while not (wd / preemption.LOCK_FILE).exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=240)
  assert proc.returncode == preemption.EXIT_PREEMPTED, err[-2000:]
  assert err.strip().splitlines()[-1] == (
    "SIGTERM received before training started: stopped, nothing to save; rerun the same "
    "command to resume"
  )
  assert "step 1/" not in out
  assert not (wd / preemption.LOCK_FILE).exists()
  assert not (wd / preemption.STATUS_FILE).exists()
  assert not (wd / "checkpoints").exists()
  if (wd / "data").exists():  # either not begun or whole, never a half-built dataset
    leftovers = [p.name for p in (wd / "data").iterdir() if p.name.startswith(".")]
    assert not leftovers
  r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=400)
  assert r.returncode == 0, r.stderr[-2000:]
  assert _status(wd)["state"] == "finished"


@pytest.mark.slow
def test_a_lost_process_ends_the_other_in_one_line(tiny_data_dir, tmp_path):
  """SIGKILL of process 1: process 0 ends within the watch's timeout (not JAX's 100 s and an
  abort) with one line naming process 1 and the exit status to rerun, its lock released and
  the run recorded as peer_lost at the checkpoint it resumes from."""
  wd = tmp_path / "wd"
  procs = _start(_two_process_cmds(wd, tiny_data_dir, 5000), _env(BERT_JAX_PEER_TIMEOUT_S="10"))
  try:
    _wait_for_step(procs[0], wd, 5)
    procs[1].kill()
    _, err = procs[0].communicate(timeout=240)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert procs[0].returncode == preemption.EXIT_PREEMPTED, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("main: error: lost process 1 of 2 (no heartbeat for "), err[-3000:]
  assert last.endswith("process 0 stops; rerun the same command to resume from the last checkpoint")
  assert not (wd / preemption.LOCK_FILE).exists()
  status = _status(wd)
  saved = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
  assert status["state"] == "peer_lost" and status["step"] == saved[-1] >= 4


def test_a_signal_while_taking_the_lock_leaves_no_lock(tmp_path, monkeypatch):
  """SIGTERM landing the moment the lock file is created (before training, so the handler
  raises Preempted): the lock is released, not left behind for the rerun to find."""
  lock = preemption.WorkdirLock(str(tmp_path))
  create = lock._try_create

  def create_then_signal(owner):
    made = create(owner)
    os.kill(os.getpid(), signal.SIGTERM)
    return made

  monkeypatch.setattr(lock, "_try_create", create_then_signal)
  with preemption.Preemption(), pytest.raises(preemption.Preempted):
    with lock:
      pytest.fail("the signal must stop the run before its body")
  assert not (tmp_path / preemption.LOCK_FILE).exists()


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


def _new_pid_namespace():
  """The command prefix that runs a command as pid 1 of a new pid namespace, killed with it (a
  container's trainer, as `docker run` starts it), or None where that needs root we lack."""
  cmd = ["unshare", "--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc"]
  if os.geteuid() != 0 or not shutil.which("unshare"):
    return None
  return cmd if subprocess.run([*cmd, "true"], capture_output=True).returncode == 0 else None


def _wait_for_checkpoint(proc, workdir, step, timeout=240):
  """Until the checkpoint of `step` is committed (orbax renames its temporary directory to the
  step's number once every file is written)."""
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if (workdir / "checkpoints" / str(step)).is_dir():
      return
    time.sleep(0.05)
  raise AssertionError(f"run ended or stalled before its checkpoint {step}: {proc.poll()}")


def _wait_until_gone(lock_path, timeout=60):
  """Until the kernel has dropped the flock of a SIGKILLed holder (its exit takes a moment
  after its parent's)."""
  deadline = time.time() + timeout
  while preemption._flock_held(str(lock_path)) and time.time() < deadline:
    time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_container_trainers_lock_is_taken_over(tiny_data_dir, tmp_path):
  """37.2: a trainer that is pid 1 of its pid namespace (a container's) is SIGKILLed with its
  namespace; its lock says pid 1 on this host, and pid 1 runs here too (this namespace's
  init), which used to block every rerun. The lock's flock is gone with its holder: the rerun
  takes it over, resumes and finishes."""
  unshare = _new_pid_namespace()
  if unshare is None:
    pytest.skip("needs root and unshare (the in-process test below records a foreign holder)")
  wd = tmp_path / "wd"
  warmup = ["--config.opt.warmup_steps=1"]  # the same schedule when the rerun asks for 6 steps
  proc = subprocess.Popen(
    [*unshare, *_main_cmd(wd, tiny_data_dir, 500, warmup)],
    env=_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  _wait_for_step(proc, wd, 5)
  _wait_for_checkpoint(proc, wd, 4)  # saved asynchronously: step 5's log line may come first
  lock = json.loads((wd / preemption.LOCK_FILE).read_text())
  assert lock["pid"] == 1 and lock["host"] == socket.gethostname() and lock["flock"]
  proc.kill()  # unshare, and with it (--kill-child) the trainer: pid 1 of its namespace
  proc.wait()
  _wait_until_gone(wd / preemption.LOCK_FILE)
  assert (wd / preemption.LOCK_FILE).exists()
  r = subprocess.run(
    _main_cmd(wd, tiny_data_dir, 6, warmup), env=_env(), capture_output=True, text=True, timeout=400
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert (
    f"Taking over the lock {wd / preemption.LOCK_FILE} of a dead trainer: its holder (pid 1 of "
    "another pid namespace) is gone"
  ) in r.stderr
  assert "Resumed from" in r.stdout
  assert _status(wd) == {"state": "finished", "step": 6, "total_steps": 6}
  assert not (wd / preemption.LOCK_FILE).exists()


HOLD = (
  "import sys; from bert_jax.runtime import preemption; "
  "lock = preemption.WorkdirLock(sys.argv[1]); "
  "lock.acquire(); print('held', flush=True); sys.stdin.read()"
)


def test_lock_tells_live_holders_from_dead_ones(tmp_path):
  """37.2: by more than a pid. A live trainer (another process; in another pid namespace too,
  where root may make one) is refused with a line saying how to clear it, and taken over once
  SIGKILLed; a lock naming pid 1 of a namespace that is gone, a pid now another process's
  (another start time) and an older version's 2-hour-old lock of a running pid are dead."""
  path = tmp_path / preemption.LOCK_FILE
  lock = preemption.WorkdirLock(str(tmp_path))
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

  me = preemption.WorkdirLock._identity()
  dead = {
    # pid 1 (of a container that is gone): its namespace's, not ours; nobody holds the flock
    "container": {**me, "pid": 1, "pidns": "pid:[1]", "start": 1, "flock": True},
    # our parent's pid, reused: its process started at another time
    "reused pid": {**me, "pid": os.getppid(), "start": preemption.process_start(os.getppid()) + 1},
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


# ----------------------------------------------------------------------------- 48: at any moment

CORPUS = str(
  pathlib.Path(__file__).resolve().parents[1] / "bert_jax" / "data" / "sample_public_domain.txt"
)
STEPS48 = 16
# Evals at steps 8 and 16 over 200 batches of a big held-out split (a few seconds on two
# processes: long enough to be signalled in), checkpoints every 4 steps, all kept (the
# preemption's step stays on disk beside them).
EXTRA48 = ["--config.eval.every_steps=8", "--config.eval.max_batches=200", "--config.ckpt.keep=100"]


@pytest.fixture(scope="module")
def eval_data_dir(tmp_path_factory):
  """The bundled corpus at sequence length 64 with 7 of its 15 documents held out (small
  chunks: the hash threshold picks them, not the small-corpus rule): 1,741 eval sequences."""
  out = tmp_path_factory.mktemp("data48") / "d"
  pretraining_data.build(
    CORPUS,
    str(out),
    max_seq_length=64,
    max_predictions_per_seq=10,
    dupe_factor=1,
    eval_fraction=0.4,
    num_workers=1,
    progress=False,
    chunk_chars=32 << 10,
  )
  return str(out)


@pytest.fixture(scope="module")
def reference48(eval_data_dir, tmp_path_factory):
  """An uninterrupted two-process run of the tests below."""
  wd = tmp_path_factory.mktemp("ref48") / "wd"
  rcs, errs = _finish(_start(_two_process_cmds(wd, eval_data_dir, STEPS48, EXTRA48)))
  assert rcs == [0, 0], errs[0][-2000:] + errs[1][-2000:]
  return wd


class _Watched:
  """Processes whose stderr lines are collected as they come, so that a test can act on one."""

  def __init__(self, cmds, env=None, **kw):
    self.procs = [
      subprocess.Popen(
        c, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
      )
      for c in cmds
    ]
    self.err: list[list[str]] = [[] for _ in cmds]
    self.out: list[list[str]] = [[] for _ in cmds]
    self.threads = [
      threading.Thread(target=lambda f, lines: lines.extend(f), args=(f, lines), daemon=True)
      for p, e, o in zip(self.procs, self.err, self.out, strict=True)
      for f, lines in ((p.stderr, e), (p.stdout, o))
    ]
    for t in self.threads:
      t.start()

  def wait(self, condition, what, timeout=300):
    deadline = time.time() + timeout
    while not condition():
      if time.time() > deadline or any(p.poll() is not None for p in self.procs):
        self.kill()
        raise AssertionError(f"never {what}: {[p.poll() for p in self.procs]} {self.tails()}")
      time.sleep(0.005)

  def said(self, i, text):
    return any(text in line for line in list(self.err[i]))

  def signal_twice(self, sig=signal.SIGTERM, gap=0.01):
    """`sig` to every process, then again `gap` s later (a scheduler's, then a batch script's)."""
    for _ in range(2):
      for p in self.procs:
        p.send_signal(sig)
      time.sleep(gap)

  def finish(self, timeout=400):
    for p in self.procs:
      p.wait(timeout=timeout)
    for t in self.threads:
      t.join(timeout=30)
    return [p.returncode for p in self.procs], ["".join(e) for e in self.err]

  def tails(self):
    return ["".join(e)[-1500:] for e in self.err]

  def kill(self):
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def _logged(workdir, step):
  """Whether process 0 has logged the train row of `step` (or a later one)."""
  try:
    return any(r["step"] >= step for r in _rows(workdir))
  except (FileNotFoundError, ValueError):  # not written yet, or a line being written
    return False


def _on_disk(workdir):
  ckpts = workdir / "checkpoints"
  return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("when", ["mid_run", "eval", "checkpoint", "agreed"])
def test_sigterm_twice_to_each_of_two_processes_saves_one_step_on_both(
  eval_data_dir, reference48, tmp_path, when
):
  """48: each of two processes gets SIGTERM twice, 10 ms apart (a scheduler's signal and a
  batch script's forwarding): mid-run; in an eval (step 8's: it stops within a batch, its step
  is saved with the eval pending, which the rerun does first); while step 4's checkpoint is
  written (signalled as its step is logged, just before the write); or once more after the
  processes agreed (on the line saying so; the first signal to process 1 alone). Both save
  one step, the same, and exit 75, the lock released; the rerun ends bit-identical to an
  uninterrupted run."""
  wd = tmp_path / "wd"
  run = _Watched(_two_process_cmds(wd, eval_data_dir, STEPS48, EXTRA48))
  try:
    if when == "agreed":
      run.wait(lambda: _logged(wd, 2), "logged step 2")
      run.procs[1].send_signal(signal.SIGTERM)
      run.wait(lambda: run.said(0, "all processes save step"), "agreed")
    else:
      at = {"mid_run": 2, "eval": 8, "checkpoint": 4}[when]
      run.wait(lambda: _logged(wd, at), f"logged step {at}")
    run.signal_twice()
    rcs, errs = run.finish()
  finally:
    run.kill()
  assert rcs == [preemption.EXIT_PREEMPTED] * 2, errs[0][-3000:] + errs[1][-3000:]
  saved = ckpt_lib.read_meta(str(wd))[1]
  assert saved == max(r["step"] for r in _rows(wd)) and saved < STEPS48
  assert _status(wd) == {"state": "preempted", "step": saved, "total_steps": STEPS48}
  assert not (wd / preemption.LOCK_FILE).exists()
  on_disk = _on_disk(wd)
  assert on_disk[-1] == saved and all(s % 4 == 0 for s in on_disk[:-1]), on_disk
  # One line per process: the step they save (or the eval they stop), the same on both.
  stops = [re.findall(r"all processes (save step \d+|stop the eval)", e) for e in errs]
  assert stops[0] == stops[1] and len(stops[0]) == 1, errs
  assert "Traceback" not in errs[0] + errs[1]
  if when == "eval":
    assert saved == 8 and stops[0] == ["stop the eval"]
    assert 8 not in [r["step"] for r in _rows(wd, "eval")]  # cut short: pending
  else:
    assert stops[0] == [f"save step {saved}"]
  if when == "checkpoint":
    assert 4 in on_disk  # the write the signals came in finished whole
  rcs, errs = _finish(_start(_two_process_cmds(wd, eval_data_dir, STEPS48, EXTRA48)))
  assert rcs == [0, 0], errs[0][-2000:] + errs[1][-2000:]
  step_a, pa = _params(wd)
  step_b, pb = _params(reference48)
  assert step_a == step_b == STEPS48
  for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
    np.testing.assert_array_equal(a, b)
  assert _rows(wd) == _rows(reference48) and _rows(wd, "eval") == _rows(reference48, "eval")


def _two_process_default(workdir):
  """The bundled default (vocab and data built by process 0 on first use) as two processes."""
  port = _free_port()
  return [
    [
      sys.executable,
      "-m",
      "bert_jax.main",
      f"--config={ROOT48}:steps=300",
      f"--workdir={workdir}",
      "--config.log.fill_mask=()",
      "--config.eval.max_batches=1",
      "--config.log.every_steps=1",
      "--config.ckpt.every_steps=1000",
      "--num_cpu_devices=1",
      "--config.mesh.shape=(2,1,1)",
      "--distributed",
      "--num_processes=2",
      f"--coordinator_address=127.0.0.1:{port}",
      f"--process_id={i}",
    ]
    for i in range(2)
  ]


ROOT48 = pathlib.Path(__file__).resolve().parents[1] / "configs" / "local.py"


@pytest.mark.slow
def test_two_processes_signalled_while_process_0_builds_the_data_and_after(tmp_path):
  """48, the issue's job: the bundled default on a fresh workdir as two processes, process 0
  training the vocab and building the data. SIGTERM twice to both while it builds: both stop
  at once (exit 75, one line each, the build abandoned: nothing half-built, no checkpoint, the
  lock released). The rerun builds it; SIGTERM twice to both after step 2 (process 0 built the
  data in this very run, whose worker start used to put the default action back on SIGTERM:
  it died of the signal and took the coordination service with it) saves one step on both."""
  wd = tmp_path / "wd"
  run = _Watched(_two_process_default(wd))
  try:
    run.wait(lambda: (wd / "data").is_dir(), "began building the data")
    run.signal_twice()
    rcs, errs = run.finish()
  finally:
    run.kill()
  assert rcs == [preemption.EXIT_PREEMPTED] * 2, errs[0][-3000:] + errs[1][-3000:]
  line = (
    "process 0: SIGTERM received before training started: stopped, nothing to save; rerun the "
    "same command to resume"
  )
  assert [e.strip().splitlines()[-1] for e in errs] == [line, line], run.tails()
  assert "Traceback" not in errs[0] + errs[1]
  assert not (wd / "checkpoints").exists() and not (wd / preemption.LOCK_FILE).exists()
  if (wd / "data").exists():  # either not begun or whole, never a half-built dataset
    assert not [p.name for p in (wd / "data").iterdir() if p.name.startswith(".")]

  run = _Watched(_two_process_default(wd))
  try:
    run.wait(lambda: _logged(wd, 2), "logged step 2", timeout=600)
    run.signal_twice()
    rcs, errs = run.finish()
  finally:
    run.kill()
  assert rcs == [preemption.EXIT_PREEMPTED] * 2, errs[0][-3000:] + errs[1][-3000:]
  saved = ckpt_lib.read_meta(str(wd))[1]
  assert _on_disk(wd) == [saved] and saved >= 2
  for e in errs:
    assert re.findall(r"all processes save step (\d+) and exit", e) == [str(saved)], e[-3000:]
  assert (wd / "data" / "metadata.json").exists()
  assert not (wd / preemption.LOCK_FILE).exists()


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
  assert not (wd / preemption.LOCK_FILE).exists()
  assert not (wd / "checkpoints").exists()
  if (wd / "data").exists():  # either not begun or whole, never a half-built dataset
    assert not [p.name for p in (wd / "data").iterdir() if p.name.startswith(".")]
