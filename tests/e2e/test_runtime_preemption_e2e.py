"""The end-to-end half of tests/unit/test_runtime_preemption.py (real processes; slow): see its
docstring."""

import json
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from unit.test_runtime_preemption import _status, _wait_for_step, default_cmd
from unit.test_runtime_workdir_lock import _new_pid_namespace, _wait_until_gone
from unit.test_train import _env, _free_port, _main_cmd, _params, _rows

from bert_jax.data import pretraining as pretraining_data
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.runtime import preemption, workdir_lock


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
  assert not (wd / workdir_lock.LOCK_FILE).exists()
  assert (wd / preemption.STATUS_FILE).exists(), err[-3000:]
  status = _status(wd)
  saved = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
  assert status["state"] == "peer_lost" and status["step"] == saved[-1] >= 4


def _wait_for_checkpoint(proc, workdir, step, timeout=240):
  """Until the checkpoint of `step` is committed (orbax renames its temporary directory to the
  step's number once every file is written)."""
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if (workdir / "checkpoints" / str(step)).is_dir():
      return
    time.sleep(0.05)
  raise AssertionError(f"run ended or stalled before its checkpoint {step}: {proc.poll()}")


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
  lock = json.loads((wd / workdir_lock.LOCK_FILE).read_text())
  assert lock["pid"] == 1 and lock["host"] == socket.gethostname() and lock["flock"]
  proc.kill()  # unshare, and with it (--kill-child) the trainer: pid 1 of its namespace
  proc.wait()
  _wait_until_gone(wd / workdir_lock.LOCK_FILE)
  assert (wd / workdir_lock.LOCK_FILE).exists()
  r = subprocess.run(
    _main_cmd(wd, tiny_data_dir, 6, warmup), env=_env(), capture_output=True, text=True, timeout=400
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert (
    f"Taking over the lock {wd / workdir_lock.LOCK_FILE} of a dead trainer: its holder (pid 1 of "
    "another pid namespace) is gone"
  ) in r.stderr
  assert "Resumed from" in r.stdout
  assert _status(wd) == {"state": "finished", "step": 6, "total_steps": 6}
  assert not (wd / workdir_lock.LOCK_FILE).exists()


CORPUS = str(
  pathlib.Path(__file__).resolve().parents[2] / "bert_jax" / "data" / "sample_public_domain.txt"
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
  assert not (wd / workdir_lock.LOCK_FILE).exists()
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


ROOT48 = pathlib.Path(__file__).resolve().parents[2] / "configs" / "local.py"


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
  assert not (wd / "checkpoints").exists() and not (wd / workdir_lock.LOCK_FILE).exists()
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
  assert not (wd / workdir_lock.LOCK_FILE).exists()


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
    lock = wd / workdir_lock.LOCK_FILE
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
  assert not (wd / workdir_lock.LOCK_FILE).exists()


@pytest.mark.slow
def test_signal_before_training_exits_preempted_and_releases_the_lock(tmp_path):
  """SIGTERM while the bundled default trains its vocab and builds its data: exit 75 at once,
  one line, the lock released, nothing half-built left; the rerun builds and trains."""
  wd = tmp_path / "wd"
  cmd = default_cmd(wd)
  proc = subprocess.Popen(
    cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  deadline = time.time() + 240
  while (
    not (wd / workdir_lock.LOCK_FILE).exists() and proc.poll() is None and time.time() < deadline
  ):
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=240)
  assert proc.returncode == preemption.EXIT_PREEMPTED, err[-2000:]
  assert err.strip().splitlines()[-1] == (
    "SIGTERM received before training started: stopped, nothing to save; rerun the same "
    "command to resume"
  )
  assert "step 1/" not in out
  assert not (wd / workdir_lock.LOCK_FILE).exists()
  assert not (wd / preemption.STATUS_FILE).exists()
  assert not (wd / "checkpoints").exists()
  if (wd / "data").exists():  # either not begun or whole, never a half-built dataset
    leftovers = [p.name for p in (wd / "data").iterdir() if p.name.startswith(".")]
    assert not leftovers
  r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=400)
  assert r.returncode == 0, r.stderr[-2000:]
  assert _status(wd)["state"] == "finished"


@pytest.mark.slow
def test_stale_lock_of_a_dead_process_does_not_block(tiny_data_dir, tmp_path):
  wd = tmp_path / "wd"
  wd.mkdir()
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  (wd / workdir_lock.LOCK_FILE).write_text(
    json.dumps({"host": socket.gethostname(), "pid": dead.pid})
  )
  r = subprocess.run(
    _main_cmd(wd, tiny_data_dir, 2), env=_env(), capture_output=True, text=True, timeout=240
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert _status(wd) == {"state": "finished", "step": 2, "total_steps": 2}
  assert not (wd / workdir_lock.LOCK_FILE).exists()
