"""A one-node SLURM cluster on the test machine, for the tests of launch/
(tests/e2e/test_slurm_e2e.py).

munged, slurmctld and slurmd run with a generated `slurm.conf` in a temporary directory (their
own ports, munge socket, state and spool directories), so they touch nothing of the machine's
own SLURM or munge. They run under a small supervisor, this file run as a script, which is the
subreaper of everything below it: slurmd detaches each job's slurmstepd from itself, and a
killed slurmstepd would leave its tasks to init. Stopping the supervisor stops the daemons and
kills whatever is left below it by process id, so nothing the cluster started outlives the
tests; `Cluster.stop` then checks that no process still names the cluster's directory.

The `slurm_cluster` fixture (session scope, registered in conftest.py) starts one cluster for
the whole session, or skips when SLURM or munge is not installed (`.ci/run` installs
`slurm-wlm` and `munge`).
"""

from __future__ import annotations

import ctypes
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel")
# The states a job (or array task) ends in; REQUEUED, PENDING, RUNNING... go on.
FINAL_STATES = {
  "BOOT_FAIL",
  "CANCELLED",
  "COMPLETED",
  "DEADLINE",
  "FAILED",
  "NODE_FAIL",
  "OUT_OF_MEMORY",
  "PREEMPTED",
  "TIMEOUT",
}
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def missing() -> str | None:
  """Why no cluster can start here, or None."""
  absent = [b for b in BINARIES if shutil.which(b) is None]
  if absent:
    return f"SLURM/munge not installed (no {', '.join(absent)}; apt-get install slurm-wlm munge)"
  return None


def _free_ports(n: int) -> list[int]:
  socks = [socket.socket() for _ in range(n)]
  try:
    for s in socks:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def slurm_conf(root: str, cpus: int, extra: str = "") -> str:
  """A one-node cluster: this host (as 127.0.0.1), `cpus` CPUs, everything under `root`."""
  host = socket.gethostname().split(".")[0]
  user = getpass.getuser()
  ctld_port, slurmd_port = _free_ports(2)
  return f"""\
ClusterName=bertjaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket={root}/munge/munge.socket,cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=5
MinJobAge=600
# The node may declare more CPUs than the machine has (jobs then share the cores).
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
{extra}
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
  """A running one-node cluster: `env()` for the SLURM commands, `sbatch`, `jobs`, `wait`."""

  def __init__(self, root: str, cpus: int = 2, extra_conf: str = ""):
    self.root = root
    self.conf = os.path.join(root, "slurm.conf")
    self.cpus = cpus
    self.extra_conf = extra_conf
    self._supervisor: subprocess.Popen | None = None

  def env(self, **extra: str) -> dict[str, str]:
    """The environment for SLURM commands and jobs: this cluster's conf, no outer job's vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env["SLURM_CONF"] = self.conf
    env.update(extra)
    return env

  def run(self, *cmd: str, check: bool = True) -> str:
    r = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=60)
    if check and r.returncode:
      raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout

  def start(self, timeout: float = 60) -> None:
    os.makedirs(os.path.join(self.root, "munge"))
    for d in ("state", "spool"):
      os.makedirs(os.path.join(self.root, d))
    # munged checks that its socket's directories are reachable by everyone.
    os.chmod(self.root, 0o755)
    os.chmod(os.path.join(self.root, "munge"), 0o755)
    key = os.path.join(self.root, "munge", "munge.key")
    with open(os.open(key, os.O_CREAT | os.O_WRONLY, 0o600), "wb") as f:
      f.write(os.urandom(1024))
    with open(self.conf, "w") as f:
      f.write(slurm_conf(self.root, self.cpus, self.extra_conf))
    self._supervisor = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), self.root],
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=open(os.path.join(self.root, "supervisor.log"), "wb"),
      text=True,
    )
    line = self._supervisor.stdout.readline().strip()
    if line != "ready":
      self.stop()
      raise RuntimeError(f"the SLURM daemons did not start: {self._logs()}")
    deadline = time.time() + timeout
    while time.time() < deadline:
      state = self.run("sinfo", "-h", "-o", "%T", check=False).strip()
      if state == "idle":
        return
      time.sleep(0.2)
    self.stop()
    raise RuntimeError(f"the SLURM node did not become idle in {timeout:.0f} s: {self._logs()}")

  def _logs(self) -> str:
    out = []
    for name in ("supervisor.log", "slurmctld.log", "slurmd.log"):
      try:
        with open(os.path.join(self.root, name)) as f:
          out.append(f"{name}: " + " | ".join(f.read().splitlines()[-5:]))
      except OSError:
        pass
    return "; ".join(out)

  def sbatch(self, *args: str, env: dict[str, str] | None = None, cwd: str | None = None) -> str:
    """Submits a batch job; returns its id."""
    r = subprocess.run(
      ["sbatch", "--parsable", *args],
      env=env or self.env(),
      cwd=cwd,
      capture_output=True,
      text=True,
      timeout=60,
    )
    if r.returncode:
      raise RuntimeError(f"sbatch {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip().split(";")[0]

  def jobs(self, job: str) -> list[dict[str, str]]:
    """`scontrol show job` of a job (one record per array task), as key -> value."""
    out = self.run("scontrol", "show", "job", "-o", job, check=False)
    records = []
    for line in out.splitlines():
      record = {}
      for item in line.split():
        key, _, value = item.partition("=")
        record.setdefault(key, value)  # the first of a repeated key (e.g. JobState)
      if record:
        records.append(record)
    return records

  def wait(self, job: str, timeout: float, count: int = 1) -> list[dict[str, str]]:
    """Waits until `count` records of `job` have ended (a requeued job has not); returns them."""
    deadline = time.time() + timeout
    while True:
      records = self.jobs(job)
      if len(records) >= count and all(r["JobState"] in FINAL_STATES for r in records):
        return records
      if time.time() > deadline:
        states = [(r["JobId"], r["JobState"], r.get("Reason")) for r in records]
        raise TimeoutError(f"job {job} still running after {timeout:.0f} s: {states}")
      time.sleep(0.5)

  def cancel_all(self, timeout: float = 60) -> None:
    """Cancels every job of the cluster and waits until none runs."""
    ids = self.run("squeue", "-h", "-o", "%A", check=False).split()
    if ids:
      self.run("scancel", *ids, check=False)
    deadline = time.time() + timeout
    while self.run("squeue", "-h", "-o", "%A", check=False).split() and time.time() < deadline:
      time.sleep(0.5)

  def stop(self) -> None:
    """Stops the daemons (the supervisor kills what is left below it), then checks that no
    process started by the cluster is left: any found is killed by pid and named in an error."""
    if self._supervisor is None:
      return
    if self._supervisor.poll() is None:
      self.cancel_all()
      self._supervisor.terminate()
      try:
        self._supervisor.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self._supervisor.kill()
        self._supervisor.wait()
    self._supervisor.stdout.close()
    self._supervisor = None
    left = _processes_naming(self.root)
    for pid in left:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    if left:
      raise RuntimeError(f"processes of the test SLURM cluster outlived it (killed): {left}")


def _processes_naming(root: str) -> list[int]:
  """Processes whose command line or environment names `root` (the cluster's directory)."""
  found = []
  needle = root.encode()
  for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
      continue
    for part in ("cmdline", "environ"):
      try:
        with open(f"/proc/{name}/{part}", "rb") as f:
          if needle in f.read():
            found.append(int(name))
            break
      except OSError:  # gone, or another user's
        pass
  return found


# ----------------------------------------------------------------------------- the supervisor


def _children() -> list[int]:
  me = os.getpid()
  kids = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue
    if ppid == me:
      kids.append(int(name))
  return kids


def _reap() -> None:
  while True:
    try:
      pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return


def _supervise(root: str) -> None:
  """Runs munged, slurmctld and slurmd until SIGTERM (or the parent's death), then stops them
  and kills every process left below this one."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
  stop: list[int] = []
  for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda signum, frame: stop.append(signum))
  conf = os.path.join(root, "slurm.conf")
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  env["SLURM_CONF"] = conf
  log = open(os.path.join(root, "daemons.out"), "ab")
  munge = os.path.join(root, "munge")
  daemons = [
    subprocess.Popen(
      [
        "munged",
        "--foreground",
        f"--socket={munge}/munge.socket",
        f"--key-file={munge}/munge.key",
        f"--pid-file={munge}/munged.pid",
        f"--seed-file={munge}/munged.seed",
        f"--log-file={munge}/munged.log",
      ],
      env=env,
      stdout=log,
      stderr=log,
    )
  ]
  deadline = time.time() + 20
  while not os.path.exists(f"{munge}/munge.socket") and time.time() < deadline:
    time.sleep(0.05)
  for daemon in ("slurmctld", "slurmd"):
    daemons.append(subprocess.Popen([daemon, "-D", "-f", conf], env=env, stdout=log, stderr=log))
  if os.getppid() == 1 or not os.path.exists(f"{munge}/munge.socket"):
    stop.append(0)
  else:
    print("ready", flush=True)
  while not stop:
    time.sleep(0.2)
    _reap()  # slurmstepd and job processes that ended below this subreaper
  for p in reversed(daemons):
    p.terminate()
  deadline = time.time() + 15
  while any(p.poll() is None for p in daemons) and time.time() < deadline:
    time.sleep(0.1)
  for _ in range(100):  # what the daemons left: slurmstepd, then its orphaned tasks
    kids = _children()
    if not kids:
      break
    for pid in kids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    time.sleep(0.05)
    _reap()


# ----------------------------------------------------------------------------- the fixture


@pytest.fixture(scope="session")
def slurm_cluster():
  """One local SLURM cluster for the session (6 CPUs declared on this machine's cores, so three
  2-task jobs run side by side); skips when SLURM or munge is not installed."""
  why = missing()
  if why:
    pytest.skip(why)
  # Not under pytest's tmp_path: munged needs every directory above its socket to be
  # reachable by all users, and socket paths must stay short.
  root = tempfile.mkdtemp(prefix="bert_jax_slurm.")
  cluster = Cluster(root, cpus=6)
  try:
    cluster.start()
    yield cluster
  finally:
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  _supervise(sys.argv[1])
