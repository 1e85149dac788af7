"""bert_jax.benchmark.lockstep: the rounds alternate who goes first and settle each turn; a
worker that hangs is killed with a one-line error; live workers run turn by turn."""

import json
import math
import sys

import pytest

from bert_jax.benchmark import (
  lockstep,
  measure,
  tables,
)


def test_lockstep_rounds_alternate_who_goes_first_and_settle_each_turn():
  calls = []

  class Fake:
    def __init__(self, name, secs):
      self.name, self.secs = name, secs

    def step(self, settle=False):
      calls.append(self.name + ("s" if settle else ""))
      return self.secs

  got = lockstep.lockstep_rounds(Fake("a", 0.4), Fake("b", 1.0), 3, 1.0, settle_steps=1)
  # a's turn: a settle step, then timed 0.4 s steps until 1 s (3 of them); b's: one 1 s step.
  a_turn, b_turn = ["as", "a", "a", "a"], ["bs", "b"]
  assert calls == a_turn + b_turn + b_turn + a_turn + a_turn + b_turn
  assert got["a_turns"] == [(3, pytest.approx(1.2))] * 3 and got["b_turns"] == [(1, 1.0)] * 3
  assert got["a_settle_s"] == [0.4] * 3 and got["b_settle_s"] == [1.0] * 3


def test_lockstep_worker_that_hangs_is_killed_with_a_one_line_error():
  hang = [sys.executable, "-c", "import time; time.sleep(600)"]
  with pytest.raises(RuntimeError, match=r"^lockstep worker sleeper timed out after 2 s"):
    lockstep.LockstepWorker("sleeper", hang, timeout=2)


@pytest.mark.slow
def test_lockstep_runs_live_workers_turn_by_turn():
  """Ours against ours (an A/A run): each worker compiles once, then steps on request."""
  peer_specs = []

  def self_as_peer(pspec):
    spec = dict(size="tiny", seq=32, batch=2, dtype="float32", steps=0, warmup=1)
    spec.update(serve=True, peak=False)
    peer_specs.append(pspec)
    return measure.ours_argv(spec)

  def dies(pspec):
    return [sys.executable, "-c", "import sys; print('no model here', file=sys.stderr); exit(3)"]

  peer_list = [("hf_flax", "float32"), ("torch", "float32")]
  argv_for = {"hf_flax": self_as_peer, "torch": dies}
  recs = lockstep.measure_lockstep(
    "tiny", 32, 2, "float32", rounds=3, warmup=1, peer_list=peer_list,
    peer_python=sys.executable, peer_argv=lambda pspec: argv_for[pspec["framework"]](pspec),
    min_turn_s=0.5,
  )  # fmt: skip
  kinds = [r["kind"] for r in recs]
  assert kinds == ["lockstep", "train_step", "error", "train_step"], kinds
  lock, peer, err, ours = recs
  assert peer_specs[0]["serve"] and peer_specs[0]["framework"] == "hf_flax"
  assert lock["peer"] == "hf_flax:float32" and lock["rounds"] == 3
  assert len(lock["ours_turns"]) == len(lock["peer_turns"]) == 3
  # Each turn: whole steps until min_turn_s=0.5 s passed; ratio of tokens/s round by round.
  tps = {k: [n * 2 * 32 / t for n, t in lock[k]] for k in ("ours_turns", "peer_turns")}
  assert lock["ratio_per_round"] == [
    o / p for o, p in zip(tps["ours_turns"], tps["peer_turns"], strict=True)
  ]
  assert lock["ratio_min"] <= lock["ratio_median"] <= lock["ratio_max"]
  assert 0.2 < lock["ratio_median"] < 5  # the same step on both sides
  for n, t in lock["ours_turns"] + lock["peer_turns"]:
    assert n >= 1 and t >= 0.5
  # Each turn opens with one untimed settle step: run (a loss) but not in the times.
  assert len(peer["step_s"]) == sum(n for n, _ in lock["peer_turns"])
  assert len(peer["losses"]) == 1 + 3 + len(peer["step_s"])
  assert len(lock["ours_settle_s"]) == len(lock["peer_settle_s"]) == 3
  assert "exited (3) early" in err["error"] and "no model here" in err["error"]
  assert err["impl"] == "torch" and err["size"] == "tiny"
  # Ours stayed up through both peers: only the rounds it was asked for, then its record.
  assert ours["impl"] == "bert_jax" and ours["variant"] == {} and ours["kernels"] == "cpu"
  assert math.isclose(sum(ours["step_s"]), sum(t for _, t in lock["ours_turns"]))
  assert len(ours["losses"]) == 1 + 3 + len(ours["step_s"])  # warm-up, settle, timed
  assert 0 < ours["mfu"] < 1.5 and ours["page_faults_per_step"] >= 0
  table = tables.format_lockstep([{**lock, "pass": 0}])
  assert "| tiny | 32 | 0 | hf_flax:float32 | 3 |" in table


def test_finetune_lockstep_passes_the_task_to_both_sides(monkeypatch):
  started = {}

  class Fake:
    def __init__(self, name, argv, timeout, env=None):
      started[name] = argv
      self.secs = {"bert_jax": 0.5}.get(name, 1.5)

    def step(self, settle=False):
      return self.secs

    def finish(self):
      return {"step_s": [self.secs], "losses": [0.7]}

    def close(self):
      pass

  monkeypatch.setattr(lockstep, "LockstepWorker", Fake)
  recs = lockstep.measure_lockstep(
    "minilm", 128, 32, "float32", rounds=2, warmup=1, peer_list=[("torch", "float32")],
    peer_python="PY", min_turn_s=1.0, task="finetune",
  )  # fmt: skip
  ours_spec = json.loads(started["bert_jax"][-1].removeprefix("--worker="))
  peer_spec = json.loads(started["torch:float32"][-1])
  assert ours_spec["task"] == peer_spec["task"] == "finetune" and ours_spec["serve"]
  assert peer_spec["hidden"] == 384 and peer_spec["num_labels"] == 2
  lock, peer, _ = recs
  assert lock["task"] == "finetune" and lock["ratio_median"] == 3.0
  # Turns of whole steps until 1 s: ours 2 steps of 0.5 s, the peer's one of 1.5 s.
  assert lock["ours_examples_per_s"] == 2 * 32 / 1.0 and lock["peer_examples_per_s"] == 32 / 1.5
  assert peer["task"] == "finetune" and peer["examples_per_s"] == 32 / 1.5
