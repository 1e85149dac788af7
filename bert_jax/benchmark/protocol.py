"""The line protocol between the benchmark and the processes it measures in.

A worker process prints one `BENCH_RESULT <json>` line with its record when it is done. A
lockstep worker (one that stays up and steps on request) first prints `BENCH_READY`, then
answers each `step` or `settle` line on its stdin with `BENCH_STEP <seconds>` after running one
step, and stops serving at any other line. A GPU-session worker (`gpu.py`) prints a
`BENCH_RECORD <json>` line per event as it goes and `BENCH_READY` once it has started; then
it answers each `alone` or `build` line on its stdin (its alone and build phases) with
`BENCH_READY` when that phase is done, and after a `time` line times what it built and ends
with `BENCH_RESULT`.
Standard library only: the peer worker, in an interpreter without bert_jax, loads this file by
path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

RESULT_MARK = "BENCH_RESULT "
READY_MARK = "BENCH_READY"
STEP_MARK = "BENCH_STEP "
RECORD_MARK = "BENCH_RECORD "


def print_result(rec: dict[str, Any]) -> None:
  """The worker's last line: its record."""
  print(RESULT_MARK + json.dumps(rec), flush=True)


_PRINT_LOCK = threading.Lock()


def print_record(rec: dict[str, Any]) -> None:
  """One record of a GPU-session worker, as it happens (whole lines, from any thread)."""
  with _PRINT_LOCK:
    sys.stdout.write(RECORD_MARK + json.dumps(rec) + "\n")
    sys.stdout.flush()


def error_text(error: BaseException) -> str:
  """An exception as one short line: its type and the start of its message (XLA's
  out-of-memory errors run to pages)."""
  text = " ".join(str(error).split())
  return f"{type(error).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def serve(run_one: Callable[[], float]) -> list[float]:
  """The lockstep worker's loop: one step (`run_one()` -> seconds) per "step" or "settle"
  line on stdin, until any other line. Returns the seconds of the "step" steps ("settle" ones
  are not measurements)."""
  print(READY_MARK, flush=True)
  times = []
  for line in sys.stdin:
    cmd = line.strip()
    if cmd not in ("step", "settle"):
      break
    t = run_one()
    if cmd == "step":
      times.append(t)
    print(STEP_MARK + json.dumps(t), flush=True)
  return times


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
  """This process's environment for a worker, with `extra` entries on top."""
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")  # a libtpu install otherwise logs errors at start
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return {**env, **(extra or {})}


def run_once(argv: list[str], timeout: float) -> dict[str, Any]:
  """Runs a worker to its end; returns its record, or raises RuntimeError with the tail of
  its output."""
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=worker_env())
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(RESULT_MARK):
      return json.loads(line[len(RESULT_MARK) :])
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
  raise RuntimeError(f"benchmark worker {argv[1:3]} failed (exit {proc.returncode}): {tail}")
