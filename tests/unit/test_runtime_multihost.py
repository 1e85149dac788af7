"""bert_jax.runtime.multihost: the lost-peer watch against an in-memory key-value store (the
coordination service's interface): a peer whose heartbeat stops, or a coordinator that no longer
answers, ends this process in one line after its cleanups; a peer that finished is never lost.
The two-process runs are tests/e2e/test_runtime_preemption_e2e.py."""

import threading
import time
import types

import pytest

from bert_jax.runtime import multihost, preemption


class _Store:
  """The coordination service's key-value calls PeerWatch makes."""

  def __init__(self, fail=None):
    self.kv, self.fail = {}, fail

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.fail:
      raise RuntimeError(self.fail)
    self.kv[key] = value

  def key_value_dir_get(self, prefix):
    return [(k, v) for k, v in self.kv.items() if k.startswith(prefix + "/")]


@pytest.fixture
def exits(monkeypatch):
  """os._exit recorded instead of taken; heartbeats every 10 ms."""
  codes = []
  monkeypatch.setattr(multihost.os, "_exit", codes.append)
  monkeypatch.setattr(multihost, "INTERVAL_S", 0.01)
  return codes


def test_a_silent_peer_is_lost_after_the_timeout_and_the_cleanups_run(exits, capsys):
  watch = multihost.PeerWatch(_Store(), 0, 3, "train", timeout_s=0.05)
  ran = []
  watch.cleanups += [lambda: ran.append("lock"), lambda: 1 / 0, lambda: ran.append("status")]
  store = watch.client
  store.kv["bert_jax/peer/done/2"] = "1"  # process 2 ended normally: never lost
  store.kv["bert_jax/peer/beat/1"] = "7"  # process 1 beat, then went silent
  watch.start()
  watch.thread.join(timeout=30)
  assert not watch.thread.is_alive() and exits == [preemption.EXIT_PREEMPTED]
  assert ran == ["lock", "status"]  # a failing cleanup does not stop the others
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith("train: error: lost process 1 of 3 (no heartbeat for ")
  assert line.endswith("process 0 stops; rerun the same command to resume from the last checkpoint")
  assert int(store.kv["bert_jax/peer/beat/0"]) > 1  # this process kept beating meanwhile


def test_a_peer_that_never_beats_is_lost_after_the_timeout(exits, capsys):
  """A peer that dies before its first heartbeat (no counter ever written) is lost too: the
  clock starts at this process's first look, not at the peer's first beat."""
  watch = multihost.PeerWatch(_Store(), 0, 2, "train", timeout_s=0.05)
  watch.start()
  watch.thread.join(timeout=30)
  assert not watch.thread.is_alive() and exits == [preemption.EXIT_PREEMPTED]
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith("train: error: lost process 1 of 2 (no heartbeat for ")


def test_a_coordinator_that_does_not_answer_is_process_0_lost(exits, capsys):
  watch = multihost.PeerWatch(_Store(fail="DEADLINE_EXCEEDED\nmore"), 1, 2, "finetune")
  watch.start()
  watch.thread.join(timeout=30)
  assert exits == [preemption.EXIT_PREEMPTED]
  assert capsys.readouterr().err.splitlines() == [
    "finetune: error: lost process 0 of 2 (the coordinator does not answer (DEADLINE_EXCEEDED)): "
    "process 1 stops; rerun the same command to resume from the last checkpoint"
  ]


def test_a_beating_peer_is_not_lost_and_stop_marks_this_process_done(exits, monkeypatch):
  store = _Store()
  watch = multihost.PeerWatch(store, 0, 2, "train", timeout_s=0.05)
  beats = iter(range(1, 10**6))
  real_get = store.key_value_dir_get

  def peer_beats(prefix):
    store.kv["bert_jax/peer/beat/1"] = str(next(beats))  # the peer moves on every look
    return real_get(prefix)

  monkeypatch.setattr(store, "key_value_dir_get", peer_beats)
  watch.start()
  watch.thread.join(timeout=0.3)  # six timeouts
  assert watch.thread.is_alive() and exits == []
  watch.stop()
  assert not watch.thread.is_alive() and store.kv["bert_jax/peer/done/0"] == "1"


def test_cleanups_register_only_with_a_watch(monkeypatch):
  monkeypatch.setattr(multihost, "_watch", None)
  assert multihost.on_cleanup(lambda: None)() is None  # single-process: nothing to register
  watch = multihost.PeerWatch(_Store(), 0, 2, "train")
  monkeypatch.setattr(multihost, "_watch", watch)
  fn = lambda: None  # noqa: E731
  unregister = multihost.on_cleanup(fn)
  assert watch.cleanups == [fn]
  unregister()
  assert watch.cleanups == []


def test_wait_for_lost_peer_waits_once_for_the_watch_then_returns_at_once(monkeypatch):
  """After an error, the run waits (inside its workdir lock, cleanups registered) for the watch
  to name a lost peer; when none is lost it returns, and the same error's later call on its way
  up (the CLI's) does not wait a second time."""
  stop = threading.Event()
  alive = threading.Thread(target=stop.wait, daemon=True)
  alive.start()
  watch = types.SimpleNamespace(timeout_s=0.2, thread=alive)
  naps = []
  monkeypatch.setattr(multihost, "_watch", watch)
  monkeypatch.setattr(multihost, "_waited", False)
  monkeypatch.setattr(multihost, "INTERVAL_S", 0.05)
  real_sleep = time.sleep
  monkeypatch.setattr(multihost.time, "sleep", lambda s: (naps.append(s), real_sleep(s)))
  try:
    multihost.wait_for_lost_peer()
    first = len(naps)
    multihost.wait_for_lost_peer()
  finally:
    stop.set()
  assert first >= 2 and len(naps) == first
