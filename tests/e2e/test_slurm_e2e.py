"""The end-to-end half of tests/unit/test_slurm.py (real processes; slow): see its
docstring."""

import json
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from unit import test_slurm as unit_slurm
from unit.test_slurm import (  # noqa: F401 (fixtures too)
  CKPT_EVERY,
  CORPUS,
  EVAL_EVERY,
  REPO,
  SBATCH,
  SIGNALS,
  STEPS,
  _flags,
  _job_env,
  _logged,
  _signal_step,
  _submit,
)
from unit.test_train import _params, _rows

# The unit half's fixtures (a one-node SLURM's jobs), shared here.
eval_data, jobs = unit_slurm.eval_data, unit_slurm.jobs


def _wait_for_step(workdir, step, job, cluster, timeout=300):
  """Blocks until the run in `workdir` has logged `step` (fails if its job ended first)."""
  deadline, check_job = time.time() + timeout, 0.0
  while time.time() < deadline:
    if _logged(workdir, step):
      return
    if time.time() > check_job:  # scontrol every 2 s, the metrics file every 0.1 s
      records = cluster.jobs(job)
      if records and records[0]["JobState"] not in ("PENDING", "RUNNING"):
        break
      check_job = time.time() + 2
    time.sleep(0.1)
  raise AssertionError(f"job {job} did not reach step {step}: {cluster.jobs(job)}")


def _status(workdir):
  return json.loads((workdir / "run_status.json").read_text())


@pytest.mark.slow
def test_two_tasks_train_to_the_end_as_one_process_does(jobs, slurm_cluster, eval_data, tmp_path):
  record, wd, out = jobs["whole"]
  assert record["JobState"] == "COMPLETED", out[-3000:]
  assert record["Restarts"] == "0" and record["ExitCode"] == "0:0"
  assert "2 processes on 1 node(s)" in out
  assert _status(wd) == {"state": "finished", "step": STEPS, "total_steps": STEPS}
  assert [r["step"] for r in _rows(wd)] == list(range(1, STEPS + 1))
  assert [r["step"] for r in _rows(wd, "eval")] == [10, 20, 30]
  one = tmp_path / "one"
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.main", *_flags(one, eval_data), "--num_cpu_devices=2"],
    env=_job_env(slurm_cluster),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert _rows(wd, "eval") == _rows(one, "eval")  # the same mesh, the same numbers


@pytest.mark.slow
@pytest.mark.parametrize("when", SIGNALS)
def test_sigterm_to_the_job_saves_one_step_requeues_and_resumes_exactly(jobs, when):
  """`scancel --signal=TERM --full`: the batch shell passes the signal to both tasks, which
  save the same step, at or after the signal's, and exit 75 (in an eval: they stop it and
  save its step with the eval pending, done first on resuming); its checkpoint is on disk; the
  job requeues itself, resumes from that step and ends with the parameters and metrics of the
  uninterrupted job."""
  record, wd, out = jobs[when]
  assert record["JobState"] == "COMPLETED", out[-3000:]
  assert record["Restarts"] == "1" and record["ExitCode"] == "0:0", out[-3000:]
  assert "SIGTERM: every task saves a checkpoint and exits 75" in out  # the batch shell's trap
  m = re.search(r"Preempted: saved step (\d+); rerun the same command to resume", out)
  assert m, out[-3000:]
  step = int(m.group(1))
  stops = re.findall(
    r"process ([01]) of 2 \([^)]*\): all processes (save step \d+|stop the eval)", out
  )
  assert sorted(i for i, _ in stops) == ["0", "1"], out[-3000:]  # both tasks, once each
  if when.startswith("eval"):
    assert step == _signal_step(when), out[-3000:]
    assert {what for _, what in stops} == {"stop the eval"}, out[-3000:]
  else:
    # The save at or after the signal's step; under load the signal may land in an eval that
    # the run reached meanwhile, which both processes then stop, saving its step.
    whats = {what for _, what in stops}
    in_eval = whats == {"stop the eval"} and step % EVAL_EVERY == 0
    assert whats == {f"save step {step}"} or in_eval, out[-3000:]
    assert _signal_step(when) <= step <= STEPS  # at the last step: its eval pending
  assert (wd / "checkpoints" / str(step)).is_dir()  # the preemption's checkpoint, on disk
  assert "Exited with exit code 75" in out and "requeued, it resumes" in out
  assert f"Resumed from {wd / 'checkpoints'} at step {step}" in out
  assert "Traceback" not in out and "Fatal Python error" not in out, out[-3000:]
  assert _status(wd) == {"state": "finished", "step": STEPS, "total_steps": STEPS}
  assert not (wd / "bert_jax.lock").exists()
  whole = jobs["whole"][1]
  step_a, pa = _params(str(wd))
  step_b, pb = _params(str(whole))
  assert step_a == step_b == STEPS
  for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
    np.testing.assert_array_equal(a, b)
  assert _rows(wd) == _rows(whole) and _rows(wd, "eval") == _rows(whole, "eval")


SWEEP_STEPS = 100
EXPERIMENT = '''"""Two tiny pretraining points (seeds 0, 1), each fine-tuned on an SST-2 fixture."""

import importlib.util

from bert_jax import config_lib

LOCAL, DATA, GLUE, STEPS = {local!r}, {data!r}, {glue!r}, {steps}


def get_config(arg=None):
  a = config_lib.parse_arg(arg, seed=0)
  spec = importlib.util.spec_from_file_location("local_config", LOCAL)
  local = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(local)
  c = local.get_config(f"size=tiny,steps={{STEPS}}")
  c.seed = a.seed
  c.data.dir = DATA
  c.model.hidden_size, c.model.intermediate_size, c.model.vocab_size = 32, 64, 30522
  c.objective.nsp = True
  c.ckpt.every_steps, c.eval.every_steps, c.eval.max_batches = 1000, 0, 2
  c.log.every_steps, c.log.fill_mask = 1, ()
  return c


def sweep(add):
  add(seed=0)
  add(seed=1)


def finetune_suite(arg):
  overrides = {{"task.glue_dir": GLUE, "seeds": 1, "opt.epochs": 1, "data.batch_size": 2}}
  return [{{"task": "sst2", "overrides": {{**overrides, "data.max_seq_length": 32}}}}]
'''


@pytest.mark.slow
def test_sweep_on_slurm_requeues_a_preempted_point_then_reports(
  slurm_cluster, tiny_data_dir, tmp_path
):
  """`launch/sweep.py --backend=slurm` submits an array (a task per point: its pretraining,
  then its fine-tuning) and a report job after it; task 0, preempted mid-pretraining, saves,
  requeues itself and resumes; the report runs once both points are done."""
  experiment = tmp_path / "two_seeds.py"
  glue = REPO / "tests" / "fixtures" / "tasks" / "glue"
  local = REPO / "configs" / "local.py"
  experiment.write_text(
    EXPERIMENT.format(local=str(local), data=tiny_data_dir, glue=str(glue), steps=SWEEP_STEPS)
  )
  root = tmp_path / "sweep root"  # a path that needs quoting in the script
  r = subprocess.run(
    [sys.executable, "launch/sweep.py", f"--experiment={experiment}", f"--root={root}"]
    + ["--backend=slurm"],
    env=_job_env(slurm_cluster),
    cwd=str(REPO),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr
  array, report = re.fullmatch(
    r"submitted array job (\d+) \(2 points\) and report job (\d+)", r.stdout.strip()
  ).groups()
  point0 = root / "seed=0"
  _wait_for_step(point0, 1, f"{array}_0", slurm_cluster)
  slurm_cluster.run("scancel", "--signal=TERM", "--full", f"{array}_0")
  (report_job,) = slurm_cluster.wait(report, 400)
  tasks = {r["ArrayTaskId"]: r for r in slurm_cluster.wait(array, 60, count=2)}
  logs = {i: (root / f"slurm-{array}_{i}.out").read_text() for i in ("0", "1")}
  assert report_job["JobState"] == "COMPLETED", (root / f"slurm-report-{report}.out").read_text()
  assert [tasks[i]["JobState"] for i in "01"] == ["COMPLETED"] * 2, logs
  assert [tasks[i]["Restarts"] for i in "01"] == ["1", "0"], logs
  # Task 0: the trainer saved at the signal, the sweep exited 75, the task requeued itself and
  # its rerun resumed the pretraining from that step.
  saved = re.findall(r"Preempted: saved step (\d+); rerun", logs["0"])
  assert len(saved) == 1 and 1 <= int(saved[0]) < SWEEP_STEPS, logs["0"]
  assert "seed=0 was preempted (exit 75)" in logs["0"]
  assert f"Resumed from {point0 / 'checkpoints'} at step {saved[0]}" in logs["0"]
  for point in ("seed=0", "seed=1"):
    wd = root / point
    assert _status(wd) == {"state": "finished", "step": SWEEP_STEPS, "total_steps": SWEEP_STEPS}
    assert (wd / "sweep_done.json").exists()
    assert json.loads((wd / "finetune" / "sst2" / "results.json").read_text())["seeds"]
    assert (wd / "finetune" / "sst2" / "sweep_done.json").exists()
  table = (root / "report" / "results.md").read_text()
  assert "seed=0" in table and "seed=1" in table
