r"""Runs every point of an experiment: its pretraining, then its fine-tuning suite; then the report.

  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:scale=cpu \
      --root=/tmp/table5 [--dry_run] [--only=task=mlm] [--config.opt.total_steps=100 ...] \
      [--finetune.opt.epochs=1 ...] [--stages=pretrain,finetune,report] \
      [--backend=local|slurm|tpu_vm] [--distributed] [--reuse=ROOT[,ROOT]] \
      [--deadline=UNIX_SECONDS|+SECONDS] [--sbatch='SBATCH OPTIONS'] [--sbatch_report='...']

--only takes a point's name, its values, or some of them (`--only=mlm`: every seed of
task=mlm; `--only=mlm,0`), several separated by ';'.
--config.KEY=VALUE goes to every pretraining run, --finetune.KEY=VALUE (as --config.KEY=VALUE)
to every fine-tuning run. --stages picks what runs (default: all three); the report stage
reports only once every run of the other stages is done (every stage's, when it runs alone;
--report_requires names them otherwise).

Convention: an experiment file defines `get_config(arg)` and `sweep(add)` (or `sweep(add,
arg)`, given the --experiment ARG, to list other points per scale); `sweep` calls
`add(key=value, ...)` once per point, with keys of the file's own `:ARG` (the values
`config_lib.parse_arg` accepts). A point's ARG is the `--experiment` ARG with the point's keys
set on top (the point wins), so every point is reproducible by hand as
`python -m bert_jax.main --config=FILE:ARG`. Its name, and its workdir under --root, is the
point's own `key=value[,key=value]` (e.g. `task=mlm`). Any `--config.x=y` flags are passed on
to every point (checked against the config first). An optional `finetune_suite(arg)` lists the
point's fine-tuning runs (experiments/_downstream.py describes a run): each is
`python -m bert_jax.finetune --config=configs/finetune.py:TASK --config.init=<root>/<point>
--workdir=<root>/<row>/finetune/<TASK> --config.KEY=VALUE ...`, where the row is the point
unless the run names its own (Table 5's `task=ltr_bilstm`: the ltr checkpoint, fine-tuned
with a BiLSTM). A run that sets `init` itself (the no-pretraining control: `init=''`, a random
init) gets no --config.init=<point>, needs a row of its own, and may name the point's files as
`{point}/...` (its tokenizer). After every point, `python -m bert_jax.report --root=<root>
[--paper=PAPER]`, where the experiment's `PAPER` names its published rows and claims.

Locally (--backend=local) points run one after another. A pretraining run is finished only
when it exited 0 and its own record (`run_status.json`) says it reached its last step; a
fine-tuning run when it exited 0 and wrote results.json. Either then gets `sweep_done.json`
in its workdir and is skipped (delete it to rerun); a point whose pretraining is not finished
is not fine-tuned. A run stopped any other way resumes from its checkpoints next time. A
preempted run (exit 75, or SIGTERM/SIGINT/SIGHUP to this script, which it passes on to the
running command) stops the sweep with exit status 75: rerun the same command to resume.
Failures are reported at the end, skip the report and make the exit status 1.

--reuse=ROOT[,ROOT] (local): a point whose pretraining config (its experiment's config for the
point's ARG, with the --config.* overrides) equals that of a finished point under one of these
roots is not run again: its workdir becomes a symbolic link to that point, fine-tuning runs
included (they are skipped where finished, and refuse to mix if the suites differ). The
experiments' cpu-scale baselines are one config (tiny, MLM+NSP, static masks, no whole-word
masking, the 62 MB corpus), so Table 6 and whole-word masking reuse Table 5's mlm_nsp point.

A fine-tuning run of a row of its own that does not start from the point's checkpoint (the
control) is keyed by its task, its flags and the content of the `{point}/...` files it names:
--reuse links it to a finished run of the same key, so every experiment's control is run once.

--deadline (local): at that time (unix seconds, or +SECONDS from now) the run in flight is sent
SIGTERM (it saves and exits; killed 60 s later if it has not), nothing more starts,
`<root>/deadline.json` lists the runs not done, the report covers the runs that are (and lists
the others), and the exit status is 75: the same command, rerun, finishes the rest.

The scheduler backends (launch/schedulers.py) run each point as this script with --only on
the scheduler's machines, so a point is done there exactly when it would be here.
--backend=slurm: an sbatch job array, task i = point i (its pretraining and fine-tuning, run
by srun; with --distributed one process per task of the allocation), requeued (`scontrol
requeue`) when SIGTERM made it save and exit 75 (a preemption, `scancel --signal=TERM --full`,
or 5 minutes before its time limit), then the report as a job of its own that waits for the
whole array (afterany) and reports once every point is done (else it fails, naming them).
--sbatch and --sbatch_report add sbatch options (partition, GPUs, time) to the array and the
report job. Tested against a one-node SLURM 22.05 (tests/e2e/test_slurm_e2e.py; docs/cluster.md).
--backend=tpu_vm: per point one Cloud TPU queued resource, set up with launch/tpu_pod.sh,
running the point on every worker (--distributed), then deleted; the report after all
(written from the gcloud reference: no TPU was available to run it). With --dry_run both print
their script and submit nothing; without, the script is written to <root>/<backend>.sh and
submitted (sbatch; bash).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from absl import flags

from bert_jax.runtime import preemption

# The scheduler backends live beside this file (it runs as a script, or is loaded by path).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import finetune_runs as finetune_runs_lib  # noqa: E402
import schedulers  # noqa: E402
from deadline import (  # noqa: E402
  DEADLINE,  # noqa: F401 -- the file a deadline writes, read as sweep.DEADLINE
  _call_passing_signals,
  _parse_deadline,
  _write_deadline,
)
from finetune_runs import (  # noqa: E402
  DONE,
  FINETUNE_CONFIG,
  RESULTS,
  FinetuneRun,
  check_finetune_overrides,
  finetune_command,
  finetune_key,
  reuse_run,
)
from points import (  # noqa: E402
  Point,
  _reuse,
  _selected,
  check_overrides,
  command,
  expand,
  load_experiment,
  pretraining_key,
  split_experiment,
)
from sweep_flags import BACKENDS, FLAGS, STAGES  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Preempted(Exception):
  """A point's run was preempted (it saved a checkpoint): the sweep stops, to be rerun."""


class PastDeadline(Exception):
  """The sweep's --deadline came: the run in flight was stopped (it saved a checkpoint)."""


def finetune_runs(path: str, point: Point) -> list[FinetuneRun]:
  """The point's downstream suite: the experiment's `finetune_suite(point.arg)`, checked."""
  return finetune_runs_lib.finetune_runs(load_experiment(path), path, point)


def report_command(
  root: str, report_module: str = "bert_jax.report", paper: str | None = None
) -> list[str]:
  """The report, with the published rows the experiment declares (its `PAPER`, a --paper of
  bert_jax.report)."""
  return [sys.executable, "-m", report_module, f"--root={root}"] + (
    [f"--paper={paper}"] if paper else []
  )


def experiment_paper(path: str) -> str | None:
  return getattr(load_experiment(path), "PAPER", None)


def _quote(cmd: list[str]) -> str:
  return " ".join(shlex.quote(c) for c in cmd)


def _run_step(
  name: str,
  cmd: list[str],
  done: str,
  env: dict[str, str] | None,
  unfinished: Callable[[], str | None],
  extra: dict[str, Any] | None = None,
  deadline: float | None = None,
) -> bool:
  """Runs one pretraining or fine-tuning command unless `done` exists, and marks it done when
  it exited 0 and `unfinished()` finds nothing missing. Returns whether it is done; raises
  Preempted on exit 75 or a signal to this script (then nothing is marked), PastDeadline when
  `deadline` (unix time) has come, before the command or while it runs (it is then sent
  SIGTERM: it saves and exits, resumable)."""
  if os.path.exists(done):
    print(f"skip {name}: finished ({done} exists; delete it to rerun)", flush=True)
    return True
  if deadline is not None and time.time() >= deadline:
    raise PastDeadline(name)
  print(f"run {name}: {_quote(cmd)}", flush=True)
  start = time.time()
  rc, signalled = _call_passing_signals(cmd, env, deadline)
  if signalled == "deadline":
    raise PastDeadline(name)
  if rc == preemption.EXIT_PREEMPTED or signalled:
    raise Preempted(f"{name} was preempted (exit {rc}): rerun the sweep to resume")
  why = f"exit {rc}" if rc else unfinished()
  if why:
    print(f"FAILED {name} ({why})", flush=True)
    return False
  tmp = done + ".tmp"
  with open(tmp, "w") as f:
    record = {"command": cmd, "seconds": round(time.time() - start, 1), **(extra or {})}
    json.dump(record, f, indent=2)
  os.replace(tmp, done)
  return True


def _pretraining_unfinished(workdir: str) -> str | None:
  state = (preemption.read_status(workdir) or {}).get("state")
  return None if state == "finished" else f"exit 0, run status {state}"


def _results_missing(results: str) -> str | None:
  return None if os.path.exists(results) else f"exit 0 without {results}"


def _checked_overrides(overrides: list[str], flag: str = "--config.") -> list[str]:
  for o in overrides:
    if not o.startswith("--config.") or "=" not in o:
      raise ValueError(f"unexpected argument {o!r}: only {flag}KEY=VALUE overrides pass on")
  return list(overrides)


@dataclasses.dataclass
class Options:
  """What a sweep runs: every flag of the command line but --experiment and --root."""

  overrides: list[str] = dataclasses.field(default_factory=list)  # --config.* (pretraining)
  finetune_overrides: list[str] = dataclasses.field(default_factory=list)  # --finetune.*
  only: str | None = None
  stages: tuple[str, ...] = STAGES
  reuse: tuple[str, ...] = ()
  backend: str = "local"
  distributed: bool = False  # multi-host: --distributed to every pretraining/fine-tuning run
  dry_run: bool = False
  sbatch: list[str] = dataclasses.field(default_factory=list)  # slurm: the array job's options
  sbatch_report: list[str] = dataclasses.field(default_factory=list)  # and the report job's
  report_requires: tuple[str, ...] | None = None  # None: the other stages (all, report alone)
  deadline: float | None = None  # unix time: stop the run in flight, start nothing more


def run(
  experiment: str,
  root: str,
  overrides: list[str] = (),
  only: str | None = None,
  dry_run: bool = False,
  env: dict[str, str] | None = None,
  main_module: str = "bert_jax.main",
  stages: tuple[str, ...] = STAGES,
  finetune_overrides: list[str] = (),
  finetune_module: str = "bert_jax.finetune",
  report_module: str = "bert_jax.report",
  distributed: bool = False,
  reuse: tuple[str, ...] = (),
  report_requires: tuple[str, ...] | None = None,
  deadline: float | None = None,
) -> list[str]:
  """Runs (or prints) the sweep on this machine; returns the names of what failed.

  Per point: its pretraining, then its fine-tuning runs; after every point the report, once
  every run of the stages in `report_requires` is done (default: the stages run here, or all
  of them when the report runs alone). At `deadline` (unix time) the run in flight is stopped
  (SIGTERM: it saves), nothing more starts, `<root>/deadline.json` lists what did not run,
  the report covers what did, and PastDeadline is raised: rerun the sweep to finish."""
  path, arg = split_experiment(experiment)
  overrides = _checked_overrides(overrides, "--config.")
  finetune_overrides = _checked_overrides(finetune_overrides, "--finetune.")
  points = _selected(expand(path, arg), only)
  check_overrides(path, points[0].arg, overrides)
  extra = ["--distributed"] if distributed else []
  if "finetune" in stages and os.path.exists(FINETUNE_CONFIG):
    check_finetune_overrides(
      [r for p in points for r in finetune_runs(path, p)], finetune_overrides
    )
  failed: list[str] = []
  try:
    _run_points(
      path, points, root, overrides, dry_run, env, main_module, stages, finetune_overrides,
      finetune_module, extra, reuse, deadline, failed,
    )  # fmt: skip
  except PastDeadline as e:
    skipped = _not_done(path, points, root, tuple(s for s in stages if s != "report"))
    _write_deadline(root, deadline, str(e), skipped)
    print(
      f"deadline: {e} was stopped or not started; {len(skipped)} run(s) not done: "
      + ", ".join(skipped),
      flush=True,
    )
    if "report" in stages and not failed:
      cmd = report_command(root, report_module, experiment_paper(path))
      print(f"report (what finished before the deadline): {_quote(cmd)}", flush=True)
      subprocess.run(cmd, env=env)
    raise PastDeadline(
      f"{len(skipped)} run(s) not done by the deadline; rerun the sweep to finish"
    ) from None
  if not dry_run and not only:
    _write_deadline(root, None, "", [])  # a finished rerun clears the last deadline's record
  if "report" in stages:
    if report_requires is None:
      report_requires = tuple(s for s in stages if s != "report") or STAGES[:2]
    cmd = report_command(root, report_module, experiment_paper(path))
    if dry_run:
      print(_quote(cmd))
    elif failed:
      print(f"no report: {len(failed)} run(s) failed", flush=True)
    elif missing := _not_done(path, points, root, report_requires):
      print(f"no report: {len(missing)} run(s) not finished: {', '.join(missing)}", flush=True)
      failed += missing
    else:
      print(f"report: {_quote(cmd)}", flush=True)
      if subprocess.run(cmd, env=env).returncode:
        failed.append("report")
  return failed


def _run_points(
  path, points, root, overrides, dry_run, env, main_module, stages, finetune_overrides,
  finetune_module, extra, reuse, deadline, failed,
) -> None:  # fmt: skip
  """run()'s loop over the points: pretraining, then fine-tuning; appends to `failed`."""
  for point in points:
    workdir = os.path.join(root, point.name)
    cmd = command(path, point, root, overrides, main_module) + extra
    if "pretrain" in stages:
      key = pretraining_key(path, point, overrides)
      if dry_run:
        print(_quote(cmd))
      elif (found := _reuse(key, workdir, list(reuse))) is not None:
        print(f"reuse {point.name}: {workdir} -> {found} (the same pretraining config)", flush=True)
      elif not _run_step(
        point.name,
        cmd,
        os.path.join(workdir, DONE),
        env,
        functools.partial(_pretraining_unfinished, workdir),
        {"key": key},
        deadline,
      ):
        failed.append(point.name)
        continue
    if "finetune" not in stages:
      continue
    if not dry_run and not os.path.exists(os.path.join(workdir, DONE)):
      print(f"FAILED {point.name}: not pretrained ({workdir}/{DONE} missing)", flush=True)
      failed.append(point.name)
      continue
    for ft in finetune_runs(path, point):
      name = f"{ft.row}/finetune/{ft.task}"
      ft_cmd = finetune_command(ft, root, finetune_overrides, finetune_module) + extra
      if dry_run:
        print(_quote(ft_cmd))
        continue
      ft_key = finetune_key(ft, root, finetune_overrides)
      if ft_key and (found := reuse_run(ft_key, ft, root, list(reuse))) is not None:
        print(f"reuse {name}: -> {found} (the same fine-tuning)", flush=True)
      results = os.path.join(ft.workdir(root), RESULTS)
      if not _run_step(
        name,
        ft_cmd,
        os.path.join(ft.workdir(root), DONE),
        env,
        functools.partial(_results_missing, results),
        {"key": ft_key} if ft_key else None,
        deadline,
      ):
        failed.append(name)


def _not_done(path: str, points: list[Point], root: str, stages: tuple[str, ...]) -> list[str]:
  """The runs of `stages` (pretrain, finetune) of `points` without their sweep_done.json."""
  missing = []
  for point in points:
    if "pretrain" in stages and not os.path.exists(os.path.join(root, point.name, DONE)):
      missing.append(point.name)
    if "finetune" in stages:
      for ft in finetune_runs(path, point):
        if not os.path.exists(os.path.join(ft.workdir(root), DONE)):
          missing.append(f"{ft.row}/finetune/{ft.task}")
  return missing


def _rel_experiment(experiment: str, repo: str) -> str:
  """The --experiment of a command run from the checkout on another machine: relative to the
  checkout when inside it (the checkout may live at another path there)."""
  path, arg = split_experiment(experiment)
  if os.path.abspath(path).startswith(repo + os.sep):
    path = os.path.relpath(os.path.abspath(path), repo)
  return f"{path}:{arg}" if arg else path


def _point_argv(experiment: str, root: str, point: Point, opts: Options, repo: str) -> list[str]:
  """The command that runs one point (pretraining and fine-tuning) on a scheduler's machine."""
  return [
    "launch/sweep.py",
    f"--experiment={_rel_experiment(experiment, repo)}",
    f"--root={root}",
    f"--only={point.name}",
    "--stages=" + ",".join(s for s in opts.stages if s != "report"),
    *opts.overrides,
    *(o.replace("--config.", "--finetune.", 1) for o in opts.finetune_overrides),
    *(["--distributed"] if opts.distributed else []),
  ]


def scheduler_sweep(
  experiment: str, root: str, points: list[Point], opts: Options
) -> schedulers.Sweep:
  """What a scheduler backend (launch/schedulers.py) runs: every point's command, then the
  report, which reports only once every point ran what `opts.stages` asked for."""
  path = split_experiment(experiment)[0]
  root = root if "://" in root else os.path.abspath(root)
  ran = [s for s in opts.stages if s != "report"]
  report = [
    "launch/sweep.py",
    f"--experiment={_rel_experiment(experiment, REPO)}",
    f"--root={root}",
    *([f"--only={opts.only}"] if opts.only else []),
    "--stages=report",
    "--report_requires=" + ",".join(ran),
  ]
  note = _quote(["python", *report_command(root, paper=experiment_paper(path))[1:]])
  return schedulers.Sweep(
    experiment=experiment,
    name=os.path.splitext(os.path.basename(path))[0],
    root=root,
    repo=REPO,
    python=sys.executable,
    points=tuple((p.name, tuple(_point_argv(experiment, root, p, opts, REPO))) for p in points),
    report=tuple(report),
    report_note=note + " once every point is done",
    distributed=opts.distributed,
  )


def launch(experiment: str, root: str, opts: Options) -> None:
  """Prints (--dry_run) or submits the scheduler script of `opts.backend`."""
  path, arg = split_experiment(experiment)
  points = _selected(expand(path, arg), opts.only)
  check_overrides(path, points[0].arg, opts.overrides)
  if set(opts.stages) == {"report"}:
    raise ValueError(f"--stages=report runs nothing on --backend={opts.backend}: run it here")
  if opts.backend == "slurm" and "://" in root:
    raise ValueError(
      f"--root={root}: SLURM writes the script and its logs there; give a directory every "
      "node mounts (a gcsfuse mount of the bucket, NFS, Lustre)"
    )
  if opts.backend == "tpu_vm":  # every worker of a slice joins the point's one JAX job
    opts = dataclasses.replace(opts, distributed=True)
  sweep = scheduler_sweep(experiment, root, points, opts)
  script = schedulers.SCRIPTS[opts.backend](sweep)
  if opts.dry_run:
    print(script, end="")
    return
  os.makedirs(root, exist_ok=True)
  file = os.path.join(root, f"{opts.backend}.sh")
  with open(file, "w") as f:
    f.write(script)
  print(schedulers.SUBMIT[opts.backend](sweep, file, opts.sbatch, opts.sbatch_report))


def _parse(argv: list[str]) -> tuple[str, str, Options]:
  """argv (without the program name) -> (experiment, root, options); ValueError if bad."""
  opts = Options()
  rest = []
  for a in argv:
    if a.startswith("--config."):
      opts.overrides.append(a)
    elif a.startswith("--finetune."):
      opts.finetune_overrides.append("--config." + a[len("--finetune.") :])
    elif a in ("-h", "--help"):
      print(__doc__ + "\nFlags:\n" + FLAGS.get_help())
      sys.exit(0)
    else:
      rest.append("--dry_run" if a == "--dry-run" else a)
  FLAGS.unparse_flags()  # every call starts from the defaults
  try:
    positional = FLAGS(["sweep.py", *rest])[1:]
  except flags.UnrecognizedFlagError as e:
    raise ValueError(f"unknown argument '--{e.flagname}'; see --help") from None
  except flags.Error as e:
    raise ValueError(str(e)) from None
  if positional:
    raise ValueError(f"unknown argument {positional[0]!r}; see --help")
  for k in ("experiment", "root"):
    if not FLAGS[k].value:
      raise ValueError(f"--{k} is required")
  opts.only = FLAGS.only
  opts.stages = tuple(FLAGS.stages)
  if not opts.stages or any(s not in STAGES for s in opts.stages):
    raise ValueError(f"--stages={','.join(FLAGS.stages)}: choose from {','.join(STAGES)}")
  if FLAGS.report_requires is not None:
    opts.report_requires = tuple(FLAGS.report_requires)
    if any(s not in STAGES[:2] for s in opts.report_requires):
      raise ValueError(
        f"--report_requires={','.join(FLAGS.report_requires)}: choose from pretrain,finetune"
      )
  opts.reuse = tuple(FLAGS.reuse)
  if FLAGS.deadline is not None:
    opts.deadline = _parse_deadline(FLAGS.deadline)
  opts.backend = FLAGS.backend
  if opts.deadline is not None and opts.backend != "local":
    raise ValueError(f"--deadline stops runs on this machine: not with --backend={opts.backend}")
  if opts.reuse and opts.backend != "local":
    raise ValueError(f"--reuse links points on this machine: not with --backend={opts.backend}")
  if opts.backend not in BACKENDS:
    raise ValueError(f"--backend={opts.backend}: choose from {', '.join(BACKENDS)}")
  opts.distributed = FLAGS.distributed
  opts.dry_run = FLAGS.dry_run
  opts.sbatch = shlex.split(FLAGS.sbatch)
  opts.sbatch_report = shlex.split(FLAGS.sbatch_report)
  return FLAGS.experiment, FLAGS.root, opts


def _stop_between_runs(signum: int, frame: Any) -> None:
  """SIGTERM/SIGINT/SIGHUP while no run is running (a run gets it passed on instead)."""
  del frame
  raise Preempted(f"{signal.Signals(signum).name} between runs: rerun the sweep to resume")


def main(argv: list[str]) -> int:
  old = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
  try:
    experiment, root, opts = _parse(argv)
    if opts.backend != "local":
      launch(experiment, root, opts)
      return 0
    # A scheduler signals every process of a point (this one too), at any moment.
    for sig in preemption.SIGNALS:
      signal.signal(sig, _stop_between_runs)
    failed = run(
      experiment,
      root,
      opts.overrides,
      opts.only,
      opts.dry_run,
      stages=opts.stages,
      finetune_overrides=opts.finetune_overrides,
      distributed=opts.distributed,
      reuse=opts.reuse,
      report_requires=opts.report_requires,
      deadline=opts.deadline,
    )
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except Preempted as e:
    print(f"preempted: {e}", file=sys.stderr)
    return preemption.EXIT_PREEMPTED
  except PastDeadline as e:
    print(f"deadline: {e}", file=sys.stderr)
    return preemption.EXIT_PREEMPTED
  except subprocess.CalledProcessError as e:
    print(f"error: {_quote([str(c) for c in e.cmd])} exited {e.returncode}", file=sys.stderr)
    return 1
  finally:
    for sig, handler in old.items():
      signal.signal(sig, handler)
  if failed:
    print(f"error: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
