"""launch/sweep.py's --deadline and its runs' signals: a run in flight gets SIGTERM at the
deadline (it saves and exits 75) and is killed only after a grace period; signals to the sweep
are passed on to the run; <root>/deadline.json lists what the deadline left undone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

from bert_jax.runtime import preemption

DEADLINE = "deadline.json"


def _write_deadline(root: str, deadline: float | None, stopped: str, skipped: list[str]) -> None:
  """<root>/deadline.json: what the last --deadline left undone (removed once all is done)."""
  path = os.path.join(root, DEADLINE)
  if not skipped:
    if os.path.exists(path):
      os.remove(path)
    return
  os.makedirs(root, exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump({"deadline": deadline, "stopped": stopped, "not_done": skipped}, f, indent=2)
  os.replace(path + ".tmp", path)


# After SIGTERM at the deadline, how long a run may take to save and exit before it is killed.
DEADLINE_GRACE_S = 60


def _call_passing_signals(
  cmd: list[str], env: dict[str, str] | None, deadline: float | None = None
) -> tuple[int, bool | str]:
  """Runs `cmd`; SIGTERM/SIGINT/SIGHUP to this script are passed on to it (it saves and exits
  75) instead of killing it; at `deadline` (unix time) it gets SIGTERM too. Returns (exit
  status, whether this script got a signal, or "deadline")."""
  procs: list[subprocess.Popen] = []
  got: list[int] = []

  def forward(signum: int, frame: Any) -> None:
    del frame
    got.append(signum)
    if procs and procs[0].poll() is None:
      procs[0].send_signal(signum)  # a second copy (a terminal's process group) is harmless

  # Installed first: a signal while the command starts is passed on once it has started.
  old = {sig: signal.signal(sig, forward) for sig in preemption.SIGNALS}
  try:
    procs.append(subprocess.Popen(cmd, env=env))
    for signum in got:
      procs[0].send_signal(signum)
    try:
      timeout = None if deadline is None else max(0.0, deadline - time.time())
      rc = procs[0].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      procs[0].send_signal(signal.SIGTERM)
      try:
        procs[0].wait(timeout=DEADLINE_GRACE_S)
      except subprocess.TimeoutExpired:
        procs[0].kill()
        procs[0].wait()
      return procs[0].returncode, "deadline"
  finally:
    for sig, handler in old.items():
      signal.signal(sig, handler)
  return rc, bool(got)


def _parse_deadline(value: str) -> float:
  """--deadline: unix seconds, or +SECONDS from now."""
  try:
    t = float(value[1:]) if value.startswith("+") else float(value)
  except ValueError:
    raise ValueError(f"--deadline={value}: not a number of seconds") from None
  return time.time() + t if value.startswith("+") else t
