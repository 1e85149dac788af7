"""The scheduler backends of launch/sweep.py: the script that runs a sweep's points on SLURM
(an array job, then a report job) or on Cloud TPU VMs (one queued resource per point), and its
submission.

A backend knows nothing of experiments: it gets a `Sweep`, every point's command (launch/sweep.py
itself, restricted to that point with --only, run from the checkout on the scheduler's
machines) and the report's. Both backends keep the local backend's meaning of done: a point
runs sweep.py there, which skips what has `sweep_done.json` and resumes the rest from its
checkpoints.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess

EXIT_PREEMPTED = 75  # bert_jax.runtime.preemption.EXIT_PREEMPTED (sweep.py exits with it too)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What a scheduler runs."""

  experiment: str  # FILE.py[:ARG], as given
  name: str  # the experiment file's name (job and resource names)
  root: str  # absolute; storage every machine sees
  repo: str  # the checkout, at the same path on every machine
  python: str  # the interpreter (SLURM: $PYTHON overrides it in the job)
  points: tuple[tuple[str, tuple[str, ...]], ...]  # (point name, sweep.py argv from the repo)
  report: tuple[str, ...]  # sweep.py argv (from the repo) of the report, run after every point
  report_note: str  # the report command it ends in, for the script's header comment
  distributed: bool  # every point is one multi-process job (a process per task / TPU worker)


def _quote(cmd: list[str] | tuple[str, ...]) -> str:
  return " ".join(shlex.quote(c) for c in cmd)


# ----------------------------------------------------------------------------- SLURM


def slurm_script(sweep: Sweep) -> str:
  """An sbatch script: a job array, task i = point i (its pretraining, then its fine-tuning),
  each run by srun as a job step.

  SIGTERM to a task (`scancel --signal=TERM --full`, the time-limit warning of --signal=B:
  below, or a preempting partition's SIGTERM to the steps) reaches the point's runs, which
  save a checkpoint and exit 75; the task then requeues itself (`scontrol requeue`) and the
  requeued task resumes, skipping what is done. srun runs in a session of its own: it answers
  a SIGTERM of its own by killing its tasks at once, so the batch shell passes the signal on
  to the job's steps (`scancel --signal=TERM JOB`) instead. Resources (GPUs, time, partition)
  go on sbatch's command line (launch/sweep.py --sbatch=...), which overrides the #SBATCH
  lines."""
  srun = ["srun", "--kill-on-bad-exit=0", "--wait=300"]
  if not sweep.distributed:
    srun.append("--ntasks=1")  # the point is one process, whatever the allocation
  report = shlex.quote(_quote(["python", *sweep.report]))
  lines = [
    "#!/usr/bin/env bash",
    f"# {len(sweep.points)} points of {sweep.experiment}, one array task each; then the",
    "# report, a job that waits for the whole array and reports once every point is done:",
    f"#   sbatch --dependency=afterany:<this job's id> --wrap={report}",
    f"#   ({sweep.report_note})",
    f"# The output directory must exist first: mkdir -p {shlex.quote(sweep.root)}",
    f"#SBATCH --job-name=bert_jax-{sweep.name}",
    f"#SBATCH --array=0-{len(sweep.points) - 1}",
    "#SBATCH --requeue",
    "#SBATCH --open-mode=append",
    "#SBATCH --signal=B:TERM@300",
    f'#SBATCH --output="{sweep.root}/slurm-%A_%a.out"',
    "set -uo pipefail",
    f"cd {shlex.quote(sweep.repo)}",
    f'PYTHON="${{PYTHON:-{sweep.python}}}"',
    'case "$SLURM_ARRAY_TASK_ID" in',
  ]
  for i, (_, argv) in enumerate(sweep.points):
    lines.append(f'  {i}) cmd=("$PYTHON" {_quote(argv)}) ;;')
  lines += [
    '  *) echo "no point for array index $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;',
    "esac",
    "# A signal for the job reaches this shell's process group (scancel --full, --signal=B:) or",
    "# the steps; srun would kill its tasks at its own SIGTERM, so it runs in a session of its",
    "# own and this shell passes the signal to the steps (all of the point's processes), once:",
    "# a process signalled by the scheduler too gets it twice, which the trainer takes as one.",
    'signalled=""',
    "forward() {",
    '  if [[ -n "$signalled" ]]; then return; fi',
    '  signalled="$1"',
    '  echo "task $SLURM_ARRAY_TASK_ID: $1: the point saves a checkpoint and exits'
    f' {EXIT_PREEMPTED}"',
    '  scancel --signal=TERM "$SLURM_JOB_ID"',
    "}",
    "trap 'forward SIGTERM' TERM",
    "trap 'forward SIGINT' INT",
    "trap 'forward SIGHUP' HUP",
    f'setsid {_quote(srun)} "${{cmd[@]}}" &',
    "pid=$!",
    "# wait returns early for each trapped signal: wait until srun is gone, then read its status.",
    'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done',
    'wait "$pid"; rc=$?',
    "trap - TERM INT HUP",
    "# Killed by a signal after the job was signalled, before it could save: its last",
    "# checkpoint is as good, so it is requeued as well.",
    f'if [[ -n "$signalled" ]] && ((rc > 128)); then rc={EXIT_PREEMPTED}; fi',
    f"if ((rc == {EXIT_PREEMPTED})); then",
    '  echo "task $SLURM_ARRAY_TASK_ID: preempted: requeued, it resumes from its checkpoints"',
    '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
    "fi",
    'exit "$rc"',
  ]
  return "\n".join(lines) + "\n"


def slurm_submit(sweep: Sweep, script: str, sbatch: list[str], sbatch_report: list[str]) -> str:
  """Submits the array (with the `sbatch` options), then the report job (`sbatch_report`;
  afterany: it starts once every task has ended, a requeued task only at its rerun's end, and
  reports only if every point is done). Returns what it submitted."""

  def submit(*args: str) -> str:
    r = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True)
    if r.returncode:
      raise OSError(f"sbatch {' '.join(args)}: {r.stderr.strip() or f'exit {r.returncode}'}")
    return r.stdout.strip().split(";")[0]

  job = submit(*sbatch, script)
  report = submit(
    *sbatch_report,
    f"--dependency=afterany:{job}",
    f"--job-name=bert_jax-{sweep.name}-report",
    f"--chdir={sweep.repo}",
    f"--output={sweep.root}/slurm-report-%j.out",
    "--wrap=" + _quote([sweep.python, *sweep.report]),
  )
  return f"submitted array job {job} ({len(sweep.points)} points) and report job {report}"


# ----------------------------------------------------------------------------- Cloud TPU VMs


def tpu_vm_script(sweep: Sweep) -> str:
  """A bash script: per point one queued resource (a TPU VM slice of its own), set up with
  launch/tpu_pod.sh, running the point on every worker, then deleted; points in parallel."""
  slug = sweep.name.replace("_", "-").lower()[:24]
  lines = [
    "#!/usr/bin/env bash",
    f"# {len(sweep.points)} points of {sweep.experiment}, one queued resource each. --root must",
    "# be storage every worker sees (a gcsfuse or Filestore mount). A point whose slice was",
    "# preempted: run its block again (it resumes from its checkpoints). Afterwards, the report:",
    f"#   {sweep.report_note}",
    "set -euo pipefail",
    f"cd {shlex.quote(sweep.repo)}",
    ': "${ZONE:?set ZONE}"',
    'ACCELERATOR="${ACCELERATOR:-v5litepod-16}"',
    'RUNTIME="${RUNTIME:-v2-alpha-tpuv5-lite}"',
    "PROJECT_FLAG=()",
    'if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="$PROJECT"); fi',
    'qr() { gcloud compute tpus queued-resources "$@" --zone="$ZONE" "${PROJECT_FLAG[@]}"; }',
    "pids=()",
  ]
  for name, argv in sweep.points:
    # Named by the point (not its index) so launches with different --only never collide.
    qr = f"bert-jax-{slug}-{re.sub('[^a-z0-9]+', '-', name.lower()).strip('-')}"[:63]
    remote = "cd bert_jax && ~/venv/bin/python " + _quote(argv)
    lines += [
      f"# point {name}",
      "(",
      f'  qr create {qr} --node-id={qr} --accelerator-type="$ACCELERATOR" '
      '--runtime-version="$RUNTIME" ${SPOT:+--spot}',
      f"  until state=\"$(qr describe {qr} --format='value(state.state)')\"; "
      '[[ "$state" == ACTIVE ]]; do',
      '    if [[ "$state" == FAILED || "$state" == SUSPENDED ]]; then '
      f'echo "{qr}: $state" >&2; exit 1; fi',
      "    sleep 60",
      "  done",
      f"  TPU_NAME={qr} launch/tpu_pod.sh setup",
      f'  gcloud compute tpus tpu-vm ssh {qr} --zone="$ZONE" "${{PROJECT_FLAG[@]}}" '
      f"--worker=all --command={shlex.quote(remote)}",
      f"  qr delete {qr} --force --quiet",
      ") &",
      "pids+=($!)",
    ]
  lines += ["rc=0", 'for pid in "${pids[@]}"; do wait "$pid" || rc=1; done', 'exit "$rc"']
  return "\n".join(lines) + "\n"


def tpu_vm_submit(sweep: Sweep, script: str, sbatch: list[str], sbatch_report: list[str]) -> str:
  """Runs the script here (it creates, uses and deletes the slices), then the report."""
  del sbatch, sbatch_report
  subprocess.run(["bash", script], check=True)
  subprocess.run([sweep.python, *sweep.report], check=True, cwd=sweep.repo)
  return f"ran {len(sweep.points)} points on TPU VMs and the report"


SCRIPTS = {"slurm": slurm_script, "tpu_vm": tpu_vm_script}
SUBMIT = {"slurm": slurm_submit, "tpu_vm": tpu_vm_submit}
