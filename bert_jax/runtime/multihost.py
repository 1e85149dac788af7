"""Multi-host runs: joining the job (`jax.distributed`) and noticing a lost process.

When one process of a multi-host run dies (killed, out of memory, its host gone), the others
would wait in their next collective: on GPUs (NCCL) until JAX's coordination service misses
its heartbeats (100 s), then abort with a fatal log (exit 134); on CPUs (gloo) the collective
fails at once, but the exit then hangs in JAX's shutdown barrier for as long. `PeerWatch`
makes that end in bounded time, the way a launcher can act on: every process publishes a
heartbeat counter in the coordination service's key-value store every `INTERVAL_S`; a peer
whose counter has not moved for `timeout_s` (or a coordinator that no longer answers) is lost,
and this process prints one line naming it, runs its cleanups (process 0 releases the workdir
lock and records the run's state) and exits `preemption.EXIT_PREEMPTED`: rerun the same command
to resume from the last checkpoint. A process that ends normally says so first, so a peer
that finishes early is never taken for lost.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import jax
from absl import logging

from bert_jax.runtime import preemption

INTERVAL_S = 2.0
# Below JAX's own heartbeat timeout (100 s), so this process ends before JAX aborts it.
TIMEOUT_S = float(os.environ.get("BERT_JAX_PEER_TIMEOUT_S", "30"))
_KEY = "bert_jax/peer"

_watch: PeerWatch | None = None
_waited = False  # wait_for_lost_peer has waited once: the error is not a lost peer's


def initialize(
  prog: str,
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
) -> None:
  """`jax.distributed.initialize` (arguments detected on TPU pods and SLURM when None), then
  the lost-peer watch on every process of a multi-process run; `prog` names the command in
  its message."""
  global _watch
  jax.distributed.initialize(
    coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
  )
  # JAX's preemption notifier has just taken SIGTERM: keep it, and catch the signal ourselves.
  preemption.take_over_sigterm()
  if jax.process_count() > 1:
    _watch = PeerWatch(_client(), jax.process_index(), jax.process_count(), prog)
    _watch.start()


def shutdown() -> None:
  """This process ends normally: stop the watch (peers stop watching it) and leave the job."""
  global _watch
  if _watch is not None:
    _watch.stop()
    _watch = None
  jax.distributed.shutdown()


def on_cleanup(fn: Callable[[], None]) -> Callable[[], None]:
  """Registers `fn` to run before a lost peer ends this process; returns its unregister."""
  if _watch is None:
    return lambda: None
  _watch.cleanups.append(fn)
  return lambda: _watch is not None and fn in _watch.cleanups and _watch.cleanups.remove(fn)


def wait_for_lost_peer() -> None:
  """After an error in a multi-process run: if a peer was lost (a collective with it fails at
  once on CPUs), give the watch the time to name it and end the process; returns if no peer
  turns out lost, so the error is reported as itself. Call it where the run's cleanups are
  still registered (inside the workdir lock), so that the lost peer's record is written; a
  later call, as the error travels up, returns at once."""
  global _waited
  if _watch is None or _waited:
    return
  deadline = time.monotonic() + _watch.timeout_s + 2 * INTERVAL_S
  while time.monotonic() < deadline and _watch.thread.is_alive():
    time.sleep(0.1)
  _waited = True


def _client():
  from jax._src import distributed

  return distributed.global_state.client


class PeerWatch:
  """The heartbeat thread of one process (see the module docstring)."""

  def __init__(self, client, index: int, count: int, prog: str, timeout_s: float = TIMEOUT_S):
    self.client, self.index, self.count, self.timeout_s = client, index, count, timeout_s
    self.prog = prog
    self.cleanups: list[Callable[[], None]] = []
    self._stop = threading.Event()
    self.thread = threading.Thread(target=self._run, daemon=True, name="peer-watch")

  def start(self) -> None:
    self.thread.start()

  def stop(self) -> None:
    try:
      self.client.key_value_set(f"{_KEY}/done/{self.index}", "1", allow_overwrite=True)
    except Exception as e:  # the job is ending anyway
      logging.warning("cannot mark process %d done: %s", self.index, e)
    self._stop.set()
    self.thread.join()

  def _run(self) -> None:
    beats = 0
    seen: dict[int, tuple[str, float]] = {}  # peer -> (its last counter, when it moved)
    peers = [i for i in range(self.count) if i != self.index]
    while not self._stop.wait(INTERVAL_S if beats else 0.0):
      beats += 1
      now = time.monotonic()
      try:
        self.client.key_value_set(f"{_KEY}/beat/{self.index}", str(beats), allow_overwrite=True)
        done = {int(k.rsplit("/", 1)[1]) for k, _ in self.client.key_value_dir_get(f"{_KEY}/done")}
        counters = dict(self.client.key_value_dir_get(f"{_KEY}/beat"))
      except Exception as e:  # the coordination service (process 0) no longer answers
        if self._stop.is_set():
          return
        self._lost(0, f"the coordinator does not answer ({str(e).splitlines()[0][:120]})")
        return
      for peer in peers:
        if peer in done:
          continue
        value = counters.get(f"{_KEY}/beat/{peer}", "")
        if peer not in seen:  # the first look starts its clock, whether it has beaten or not
          seen[peer] = (value, now)
          continue
        last_value, moved = seen[peer]
        if value != last_value:
          seen[peer] = (value, now)
        elif now - moved > self.timeout_s:
          self._lost(peer, f"no heartbeat for {now - moved:.0f} s")
          return

  def _lost(self, peer: int, why: str) -> None:
    print(
      f"{self.prog}: error: lost process {peer} of {self.count} ({why}): process {self.index} "
      "stops;"
      " rerun the same command to resume from the last checkpoint",
      file=sys.stderr,
      flush=True,
    )
    for fn in list(self.cleanups):
      try:
        fn()
      except Exception as e:  # best effort: the process is ending
        logging.warning("cleanup after a lost peer failed: %s", e)
    os._exit(preemption.EXIT_PREEMPTED)
