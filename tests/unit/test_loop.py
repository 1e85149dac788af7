"""The training loop's progress line on a fake clock: its ETA comes from the steady step rate,
not from a first step that held the compile."""

import itertools
import re

import jax
import numpy as np
import pytest

from bert_jax import loop
from bert_jax import sharding as sh


class _Clock:
  """Seconds that only the fake step moves: the first step compiles for a minute, every later
  one takes half a second."""

  def __init__(self):
    self.now = 0.0
    self.steps = 0

  def __call__(self) -> float:
    return self.now

  def step(self, state, batch, rng):
    del batch, rng
    self.steps += 1
    self.now += 60.0 if self.steps == 1 else 0.5
    return state, {"loss": 1.0, "grad_norm": 1.0, "nonfinite": 0.0}


class _NoSignal:
  def training(self) -> None:
    pass

  def should_stop(self, step: int) -> bool:
    return False


def _job(tmp_path, step_fn, clock, total: int, log_every: int, start_step: int = 0) -> loop.Job:
  return loop.Job(
    step_fn=step_fn,
    batches=itertools.repeat({"input_ids": np.zeros((8, 4), np.int32)}),
    preemption=_NoSignal(),
    mesh=sh.make_mesh((1, -1, 1)),
    rng=None,
    total_steps=total,
    logger=loop.MetricLogger(str(tmp_path), start_step),
    learning_rate=lambda step: 0.0,
    evaluate=lambda step, state: None,
    save=lambda step, state, window: None,
    log_every=log_every,
    eval_every=0,
    ckpt_every=total,
    examples_per_step=8,
    clock=clock,
  )


def _progress(tmp_path, capsys, total: int, log_every: int, start_step: int = 0) -> dict:
  """{step: ETA text} of the progress lines of a `total`-step run from `start_step`."""
  clock = _Clock()
  job = _job(tmp_path, clock.step, clock, total, log_every, start_step)
  result = loop.run(job, {}, start_step)
  job.logger.close()
  assert result.step == total
  lines = [ln for ln in capsys.readouterr().out.splitlines() if " | step " in ln]
  return {int(re.search(r"step (\d+)/", ln)[1]): ln.rsplit(" | ", 1)[1] for ln in lines}


def test_eta_is_the_steady_rate_not_the_compile(tmp_path, capsys):
  eta = _progress(tmp_path, capsys, total=200, log_every=1)
  # Step 1 held the 60 s compile: no rate yet. From step 2 on, 2 steps/s: (200 - s) / 2 s left
  # (counting from the start, step 2 would say 199 s x 99 = 1h40m).
  assert eta[1] == "ETA measuring"
  assert eta[2] == "ETA 1m39s"
  assert eta[3] == "ETA 1m38s"
  assert eta[100] == "ETA 0m50s"
  assert eta[200] == "ETA 0m00s"


def test_eta_of_a_resumed_run_skips_its_compile_too(tmp_path, capsys):
  eta = _progress(tmp_path, capsys, total=1000, log_every=100, start_step=500)
  assert eta[600] == "ETA 3m20s"  # 400 steps at 2 steps/s, the resume's compile left out
  assert eta[900] == "ETA 0m50s"


def test_eta_window():
  """Over the last `window` progress lines: a pause (an eval) stops counting once it is
  `window` lines old."""
  eta = loop.Eta(total_steps=100, window=2)
  assert eta.text() == "ETA measuring"
  eta.mark(1, 60.0)  # the compile
  eta.mark(1, 61.0)  # the same step again: no rate from it
  assert eta.text() == "ETA measuring"
  eta.mark(11, 65.0)  # 10 steps in 5 s
  assert eta.text() == "ETA 0m44s"
  eta.mark(21, 95.0)  # 10 steps in 30 s (an eval in between)
  assert eta.text() == "ETA 2m18s"  # 20 steps in 35 s, 79 left
  eta.mark(31, 100.0)
  eta.mark(41, 105.0)
  assert eta.text() == "ETA 0m29s"  # the window holds steps 21-41: 20 steps in 10 s, 59 left


def test_the_hot_loop_moves_nothing_implicitly(tmp_path):
  """Device metrics come back through the loop's explicit read; a step whose dispatch moves a
  host value to a device implicitly (a Python scalar into an array op) is refused by the
  transfer guard. (On a CPU, reading a device array on the host is no transfer, so the guard's
  device-to-host half only shows on an accelerator.)"""
  clock = _Clock()
  on_device = jax.device_put(np.float32(1.0))
  finite = jax.device_put(np.bool_(False))

  def explicit(state, batch, rng):
    clock.step(state, batch, rng)
    return state, {"loss": on_device, "grad_norm": on_device, "nonfinite": finite}

  job = _job(tmp_path, explicit, clock, total=3, log_every=1)
  assert loop.run(job, {}, 0).step == 3
  job.logger.close()

  def implicit(state, batch, rng):
    clock.step(state, batch, rng)
    return state, {"loss": on_device * 2, "grad_norm": 1.0, "nonfinite": 0.0}

  job = _job(tmp_path / "b", implicit, clock, total=3, log_every=1)
  with pytest.raises(Exception, match="[Dd]isallowed host-to-device transfer"):
    loop.run(job, {}, 0)
  job.logger.close()
