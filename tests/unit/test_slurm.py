"""launch/ against a real SLURM (one node, this machine; tests/slurm_cluster.py): a 2-task
`launch/slurm_gpu.sbatch` job trains to its last step like one process does; `scancel
--signal=TERM --full` mid-run (a cluster's preemption) saves one step on both tasks, requeues
the job and ends bit-identical to an uninterrupted job, wherever the signal lands (within a
second of the first step, past the first checkpoint interval, in an eval); `launch/sweep.py
--backend=slurm` runs its array, a task of it preempted and requeued, then the report.

One cluster serves the session; the runs are tiny (BERT with hidden size 32, 30 steps, CPU,
`--gpus-per-node=0`). Skipped where SLURM or munge is not installed.
"""

import os
import pathlib
import sys
import time

import pytest

from bert_jax.data import pretraining as pretraining_data
from unit.test_train import _rows

REPO = pathlib.Path(__file__).resolve().parents[2]
SBATCH = str(REPO / "launch" / "slurm_gpu.sbatch")
CORPUS = str(REPO / "bert_jax" / "data" / "sample_public_domain.txt")
STEPS = 30
CKPT_EVERY = 4
EVAL_EVERY = 10
# When the preempted jobs get `scancel --signal=TERM --full`: `first`, as soon as step 1 is
# logged (within a second of the first step); `N`, once step N is logged (6: past the first
# checkpoint interval); `evalN`, as eval step N's train row is logged (its eval has begun).
# BERT_JAX_SLURM_SIGNALS=first,13,eval20,... runs others (issue 48's loop ran 10).
SIGNALS = os.environ.get("BERT_JAX_SLURM_SIGNALS", "first,6,eval10").split(",")


def _flags(workdir, data_dir, steps=STEPS):
  """The trainer's flags: BERT-tiny at hidden size 32, data-parallel over 2 devices."""
  return [
    f"--config={REPO / 'configs' / 'local.py'}:size=tiny,steps={steps}",
    f"--workdir={workdir}",
    f"--config.data.dir={data_dir}",
    "--config.data.max_seq_length=64",
    "--config.masking.max_predictions=10",
    "--config.model.hidden_size=32",
    "--config.model.intermediate_size=64",
    # The fixture data has BERT's vocab and NSP pairs.
    "--config.model.vocab_size=30522",
    "--config.objective.nsp=True",
    "--config.mesh.shape=(2,1,1)",
    f"--config.ckpt.every_steps={CKPT_EVERY}",
    "--config.ckpt.keep=100",  # every checkpoint stays: the preemption's is checked on disk
    "--config.log.every_steps=1",
    f"--config.eval.every_steps={EVAL_EVERY}",  # a whole held-out split: a few seconds
    "--config.eval.max_batches=200",
    "--config.log.fill_mask=()",
  ]


def _job_env(cluster):
  """What a user sets: the python of the venv; plus the test set-up (CPU, conftest's -O0, the
  session's compilation cache)."""
  return cluster.env(
    PYTHON=sys.executable,
    PYTHONPATH=str(REPO),
    JAX_PLATFORMS="cpu",
    XLA_FLAGS="--xla_backend_optimization_level=0",
  )


def _submit(cluster, tmp, name, data_dir, *extra):
  """A 2-task job of launch/slurm_gpu.sbatch; returns (job id, workdir, output file)."""
  out, wd = tmp / f"{name}.out", tmp / name
  job = cluster.sbatch(
    "--ntasks-per-node=2",
    "--gpus-per-node=0",
    "--cpus-per-task=1",
    f"--output={out}",
    SBATCH,
    *_flags(wd, data_dir),
    "--num_cpu_devices=1",
    *extra,
    env=_job_env(cluster),
    cwd=str(REPO),
  )
  return job, wd, out


def _logged(workdir, step):
  try:
    return any(r["step"] >= step for r in _rows(workdir))
  except (FileNotFoundError, ValueError):  # not written yet, or a line being written
    return False


def _signal_step(when):
  return 1 if when == "first" else int(when.removeprefix("eval"))


@pytest.fixture(scope="module")
def eval_data(tmp_path_factory):
  """The bundled corpus at sequence length 64 (BERT's vocab, NSP pairs) with 7 of its 15
  documents held out: an eval of 109 batches, long enough to be signalled in."""
  out = tmp_path_factory.mktemp("slurm_data") / "d"
  pretraining_data.build(
    CORPUS,
    str(out),
    max_seq_length=64,
    max_predictions_per_seq=10,
    eval_fraction=0.4,
    num_workers=1,
    progress=False,
    chunk_chars=32 << 10,
  )
  return str(out)


@pytest.fixture(scope="module")
def jobs(slurm_cluster, eval_data, tmp_path_factory):
  """Side by side: an uninterrupted 2-task job, and per SIGNALS entry a 2-task job that gets
  `scancel --signal=TERM --full` at that point."""
  tmp = tmp_path_factory.mktemp("slurm_jobs")
  whole = _submit(slurm_cluster, tmp, "whole", eval_data)
  cuts = {when: _submit(slurm_cluster, tmp, f"cut_{when}", eval_data) for when in SIGNALS}
  pending = dict(cuts)
  deadline, check_jobs = time.time() + 900, time.time() + 2
  while pending:  # each job signalled the moment its step is logged
    for when, (job, wd, log) in list(pending.items()):
      if _logged(wd, _signal_step(when)):
        slurm_cluster.run("scancel", "--signal=TERM", "--full", job)
        del pending[when]
      elif time.time() > check_jobs and slurm_cluster.jobs(job)[0]["JobState"] not in (
        "PENDING",
        "RUNNING",
      ):
        raise AssertionError(f"job {when} ended before its step: {log.read_text()[-3000:]}")
    if time.time() > check_jobs:
      check_jobs = time.time() + 2
    if time.time() > deadline:
      raise AssertionError(f"jobs never reached their steps: {list(pending)}")
    time.sleep(0.02)
  runs = {"whole": (slurm_cluster.wait(whole[0], 600)[0], whole[1], whole[2].read_text())}
  for when, (job, wd, log) in cuts.items():
    runs[when] = (slurm_cluster.wait(job, 600)[0], wd, log.read_text())
  return runs


def test_a_failed_job_is_not_requeued(slurm_cluster, eval_data, tmp_path):
  """Exit 2 (a bad flag) or 1 (an error to fix) fails the job: a rerun would fail again."""
  job, wd, log = _submit(slurm_cluster, tmp_path, "bad", eval_data, "--config.opt.no_such_key=1")
  record = slurm_cluster.wait(job, 300)[0]
  out = log.read_text()
  assert record["JobState"] == "FAILED" and record["ExitCode"] == "2:0", out[-3000:]
  assert record["Restarts"] == "0"
  assert "no_such_key" in out and "requeued" not in out
  assert not (wd / "checkpoints").exists()


# ----------------------------------------------------------------------------- sweep
