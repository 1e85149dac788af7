"""Lockstep: our step and a peer's in live processes that take turns of whole steps.

Each side compiles once and stays up; a round is one turn of each, and each round gives its
own ratio. On a shared host whose speed drifts over minutes this keeps the two sides of a ratio
seconds apart instead of minutes. A turn opens with untimed settle steps: a process's first
step after the other process ran is slower (fresh memory from the kernel, most likely), and a
process that frees its activations every step (XLA, ours and HF Flax's) pays that more than
one that keeps them.
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

from bert_jax.benchmark import host, measure, peers, protocol


def lockstep_dtype(dtypes: Sequence[str] | None) -> str:
  """The one dtype a lockstep run times: the first of `dtypes`, else our fast mode on this CPU
  (bf16 where it has bf16 instructions, else float32)."""
  return dtypes[0] if dtypes else host.default_dtypes()[-1]


class LockstepWorker:
  """A measurement process kept alive between steps (`protocol.serve` on its side): it
  compiles and warms up, then runs one step each time it is asked, and reports its record at
  the end. `env` entries override this process's environment for it; a worker silent for
  `timeout` seconds (start-up included) is killed and reported."""

  def __init__(
    self,
    name: str,
    argv: list[str],
    timeout: float,
    env: dict | None = None,
    wait: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
  ):
    self.name, self.timeout, self.on_record = name, timeout, on_record
    self._err = tempfile.TemporaryFile("w+")  # a file, so a chatty stderr cannot block it
    self.proc = subprocess.Popen(
      argv,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self._err,
      text=True,
      env=protocol.worker_env(env),
    )
    if wait:
      self.wait_ready()

  def wait_ready(self, timeout: float | None = None) -> None:
    """Waits for the worker's READY line (a GPU-session worker: its build phase)."""
    self._read_until(protocol.READY_MARK, timeout)

  def _read_until(self, mark: str, timeout: float | None = None) -> str:
    timeout = self.timeout if timeout is None else timeout
    timed_out = threading.Event()

    def stop() -> None:
      timed_out.set()
      self.proc.kill()  # unblocks the readline below

    watchdog = threading.Timer(timeout, stop)
    watchdog.start()
    try:
      while line := self.proc.stdout.readline():
        if line.startswith(mark):
          return line[len(mark) :]
        if self.on_record and line.startswith(protocol.RECORD_MARK):
          self.on_record(json.loads(line[len(protocol.RECORD_MARK) :]))
    finally:
      watchdog.cancel()
    self._err.seek(0)
    tail = self._err.read().strip().splitlines()[-3:]
    code = self.proc.wait()
    why = f"timed out after {timeout:g} s" if timed_out.is_set() else f"exited ({code}) early"
    raise RuntimeError(f"lockstep worker {self.name} {why}: {tail}")

  def command(self, command: str, timeout: float | None = None) -> None:
    """Sends `command` and waits for the worker's next READY line (a GPU-session worker: the
    end of that phase)."""
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()
    self._read_until(protocol.READY_MARK, timeout)

  def step(self, settle: bool = False) -> float:
    """Runs one step; returns its seconds."""
    self.proc.stdin.write("settle\n" if settle else "step\n")
    self.proc.stdin.flush()
    return float(self._read_until(protocol.STEP_MARK))

  def finish(self, command: str = "end", timeout: float | None = None) -> dict[str, Any]:
    """Sends `command` ("end": stop serving; a GPU-session worker: "time") and returns the
    worker's record."""
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()
    rec = json.loads(self._read_until(protocol.RESULT_MARK, timeout))
    self.proc.wait(timeout=self.timeout)
    return rec

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    self._err.close()


def lockstep_rounds(
  a: LockstepWorker, b: LockstepWorker, rounds: int, min_turn_s: float, settle_steps: int
) -> dict[str, list]:
  """`rounds` rounds of one turn each of `a` and `b`, `a` first in even rounds and `b` first in
  odd ones. A turn is `settle_steps` untimed steps, then timed whole steps until `min_turn_s`
  have passed. Returns per worker its turns as (steps, seconds) and its settle steps' seconds."""
  out: dict[str, list] = {"a_turns": [], "b_turns": [], "a_settle_s": [], "b_settle_s": []}
  for r in range(rounds):
    for w, k in ((a, "a"), (b, "b"))[:: 1 if r % 2 == 0 else -1]:
      out[f"{k}_settle_s"] += [w.step(settle=True) for _ in range(settle_steps)]
      n, t = 0, 0.0
      while n == 0 or t < min_turn_s:
        n, t = n + 1, t + w.step()
      out[f"{k}_turns"].append((n, t))
  return out


def _lockstep_record(pspec: dict[str, Any], got: dict[str, list], rounds: int) -> dict[str, Any]:
  tokens = pspec["batch"] * pspec["seq"]
  ours_tps = [n * tokens / t for n, t in got["a_turns"]]
  peer_tps = [n * tokens / t for n, t in got["b_turns"]]
  ratios = [a / b for a, b in zip(ours_tps, peer_tps, strict=True)]
  return {
    "kind": "lockstep",
    "task": pspec["task"],
    "peer": f"{pspec['framework']}:{pspec['dtype']}",
    "rounds": rounds,
    "ours_turns": got["a_turns"],
    "peer_turns": got["b_turns"],
    "ours_settle_s": got["a_settle_s"],
    "peer_settle_s": got["b_settle_s"],
    "ratio_per_round": ratios,  # ours tokens/s over the peer's, round by round
    "ratio_min": min(ratios),
    "ratio_median": statistics.median(ratios),
    "ratio_max": max(ratios),
    "ours_tokens_per_s": statistics.median(ours_tps),
    "peer_tokens_per_s": statistics.median(peer_tps),
    "ours_examples_per_s": statistics.median(ours_tps) / pspec["seq"],
    "peer_examples_per_s": statistics.median(peer_tps) / pspec["seq"],
  }


def measure_lockstep(
  size: str,
  seq: int,
  batch: int,
  dtype: str,
  rounds: int,
  warmup: int,
  peer_list: Sequence[tuple[str, str]],
  peer_python: str,
  timeout: float = 3600,
  peer_argv: Callable[[dict[str, Any]], list[str]] | None = None,
  min_turn_s: float = 3.0,
  settle_steps: int = 1,
  task: str = "pretrain",
) -> list[dict[str, Any]]:
  """Ours against each peer in alternating turns (`lockstep_rounds`), `rounds` rounds per peer,
  timing `task`'s train step ("pretrain" or "finetune").

  Our worker compiles once and stays up; the peers come one at a time beside it (so at most
  two models are resident). Returns per peer a "lockstep" record (the ratios round by round)
  and the peer's step record, or an "error" record if the peer did not start; ours (all its
  timed steps, MFU against its own matmul peak) last. `peer_argv(spec) -> argv` replaces the
  peer worker (the tests time ours against ours).
  """
  peer_argv = peer_argv or functools.partial(peers.peer_argv, peer_python)
  spec = dict(size=size, seq=seq, batch=batch, dtype=dtype, steps=0, warmup=warmup, serve=True)
  ours = LockstepWorker("bert_jax", measure.ours_argv({**spec, "task": task}), timeout)
  shape = {"size": size, "seq": seq, "batch": batch, "dtype": dtype, "task": task}
  out: list[dict[str, Any]] = []
  try:
    for fw, dt in peer_list:
      pspec = peers.peer_spec(fw, dt, size, seq, batch, task)
      pspec.update(warmup=warmup, serve=True)
      try:
        peer = LockstepWorker(f"{fw}:{dt}", peer_argv(pspec), timeout)
      except RuntimeError as e:
        out.append({**shape, "kind": "error", "impl": fw, "dtype": dt, "error": str(e)[-500:]})
        continue
      try:
        got = lockstep_rounds(ours, peer, rounds, min_turn_s, settle_steps)
        prec = peers.peer_record(pspec, peer.finish())
      finally:
        peer.close()
      settings = {"min_turn_s": min_turn_s, "settle_steps": settle_steps}
      out += [{**shape, **settings, **_lockstep_record(pspec, got, rounds)}, prec]
    out.append(ours.finish())
  finally:
    ours.close()
  return out
