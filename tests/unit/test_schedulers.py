"""launch/sweep.py on the schedulers (launch/schedulers.py): SLURM's array job and report job, a
TPU VM's queued resources (dry runs), the report waiting for every point, fine-tuning overrides
checked against the task config, and points that pretrain the same reused."""

import os
import shlex
import subprocess
import sys

import pytest

from unit.test_sweep import REPO, TABLE5, TASKS, _calls, _fake_all, sweep

TABLE6 = os.path.join(REPO, "experiments", "table6_model_size.py")


def _launch(capsys, *args):
  assert sweep.main(list(args)) == 0
  return capsys.readouterr().out


def test_slurm_dry_run_is_one_array_task_per_point(capsys, tmp_path):
  root = tmp_path / "a root"  # a path that needs quoting
  out = _launch(
    capsys,
    f"--experiment={TABLE6}:scale=gpu,seeds=1",
    f"--root={root}",
    "--backend=slurm",
    "--dry_run",
    "--config.opt.total_steps=7",
    "--finetune.opt.epochs=1",
  )
  lines = out.splitlines()
  assert lines[0] == "#!/usr/bin/env bash"
  assert "#SBATCH --array=0-3" in lines and "#SBATCH --requeue" in lines
  tasks = [ln for ln in lines if ln.startswith("  ") and ") cmd=(" in ln]
  assert len(tasks) == 4
  for i, (ln, row) in enumerate(
    zip(tasks, ("tiny", "L4_H128_A2", "L2_H256_A4", "mini"), strict=True)
  ):
    assert ln.startswith(f'  {i}) cmd=("$PYTHON" launch/sweep.py ')
    assert (
      f"--experiment=experiments/table6_model_size.py:scale=gpu,seeds=1 '--root={root}' "
      f"--only=row={row},seed=0 --stages=pretrain,finetune --config.opt.total_steps=7 "
      "--finetune.opt.epochs=1) ;;"
    ) in ln
  assert '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in lines
  assert any("bert_jax.report" in ln and "--paper=table6" in ln for ln in lines)
  assert "if ((rc == 75)); then" in lines
  # srun out of the batch shell's process group (its own SIGTERM would kill the point); the
  # shell passes signals on to the steps; the report waits for the whole array.
  assert 'setsid srun --kill-on-bad-exit=0 --wait=300 --ntasks=1 "${cmd[@]}" &' in lines
  assert "trap 'forward SIGTERM' TERM" in lines
  assert '  scancel --signal=TERM "$SLURM_JOB_ID"' in lines
  report = next(ln for ln in lines if "--dependency=" in ln)
  assert "afterany:" in report and "--stages=report --report_requires=pretrain,finetune" in report
  assert not root.exists()
  # The script is valid bash.
  script = tmp_path / "job.sbatch"
  script.write_text(out)
  assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
  # --distributed: the point is one process per task of the allocation.
  args = [
    f"--experiment={TABLE6}:scale=gpu,seeds=1",
    f"--root={root}",
    "--backend=slurm",
    "--dry_run",
  ]
  out = _launch(capsys, *args, "--distributed")
  assert 'setsid srun --kill-on-bad-exit=0 --wait=300 "${cmd[@]}" &' in out.splitlines()
  assert out.count("--distributed) ;;") == 4


def test_report_alone_waits_until_every_point_is_done(tmp_path, capsys):
  """The report stage on its own (a scheduler's report job) reports only once every point's
  runs have sweep_done.json; otherwise it names what is missing and fails."""
  root = tmp_path / "root"
  kwargs = _fake_all(tmp_path)
  pretrain_only = {**kwargs, "stages": ("pretrain",)}
  assert sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), only="mlm;ltr", **pretrain_only) == []
  (root / "task=ltr,seed=0" / sweep.DONE).unlink()  # as if its task were still to be requeued
  capsys.readouterr()
  report_only = {**kwargs, "stages": ("report",)}
  failed = sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), only="mlm;ltr", **report_only)
  assert (
    failed[:2] == [f"task=mlm,seed=0/finetune/{t}" for t in TASKS[:2]]
    and "task=ltr,seed=0" in failed
  )
  assert len(failed) == 5 + 1 + 5 + 5  # ltr's BiLSTM row too
  assert (
    f"no report: {len(failed)} run(s) not finished: task=mlm,seed=0/finetune/"
    in capsys.readouterr().out
  )
  assert not (root / "report.md").exists()
  # Only the pretraining required (a sweep launched with --stages=pretrain,report).
  requires = {**report_only, "report_requires": ("pretrain",)}
  assert sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), only="mlm", **requires) == []
  assert (root / "report.md").read_text() == "report\n"
  r = subprocess.run(
    [sys.executable, os.path.join(REPO, "launch", "sweep.py"), f"--experiment={TABLE5}"]
    + [f"--root={root}", "--backend=slurm", "--stages=report"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 1
  assert r.stderr.strip() == "error: --stages=report runs nothing on --backend=slurm: run it here"
  assert sweep.main([f"--experiment={TABLE5}", "--root=gs://b/t5", "--backend=slurm"]) == 1
  assert "--root=gs://b/t5: SLURM writes the script and its logs there" in capsys.readouterr().err


def test_tpu_vm_dry_run_is_one_queued_resource_per_point(capsys, tmp_path):
  out = _launch(
    capsys,
    f"--experiment={TABLE5}:scale=full",
    "--root=/mnt/shared/my table5",
    "--backend=tpu_vm",
    "--dry_run",
    "--only=mlm,0;ltr,0",
  )
  lines = out.splitlines()
  creates = [ln for ln in lines if "qr create" in ln]
  assert [ln.split()[2] for ln in creates] == [
    "bert-jax-table5-pretraining-tasks-task-mlm-seed-0",
    "bert-jax-table5-pretraining-tasks-task-ltr-seed-0",
  ]
  ssh = [ln for ln in lines if "tpu-vm ssh" in ln]
  assert len(ssh) == 2
  for ln, point in zip(ssh, ("task=mlm,seed=0", "task=ltr,seed=0"), strict=True):
    assert "--worker=all" in ln
    # The remote command is one quoted word; the root inside it quoted again.
    remote = shlex.split(ln.split("--command=", 1)[1])[0]
    assert shlex.split(remote)[4:] == [
      "launch/sweep.py",
      "--experiment=experiments/table5_pretraining_tasks.py:scale=full",
      "--root=/mnt/shared/my table5",
      f"--only={point}",
      "--stages=pretrain,finetune",
      "--distributed",
    ]
  script = tmp_path / "tpu.sh"
  script.write_text(out)
  assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_finetune_overrides_are_checked_against_the_task_config(tmp_path):
  config = tmp_path / "finetune.py"
  config.write_text(
    "import ml_collections\n"
    "def get_config(arg):\n"
    "  c = ml_collections.ConfigDict({'opt': {'lr': 1e-3, 'epochs': 2}, 'seeds': 1})\n"
    "  if arg == 'vitaminc':\n"
    "    c.pairs = True\n"
    "  return c\n"
  )
  point = sweep.expand(TABLE5, "scale=gpu,seeds=1")[0]
  runs = [
    sweep.FinetuneRun(point.name, "rotten_tomatoes", point.name, ("--config.opt.lr=1",)),
    sweep.FinetuneRun(point.name, "vitaminc", point.name, ("--config.pairs=False",)),
  ]
  sweep.check_finetune_overrides(runs, ["--config.seeds=3"], str(config))
  with pytest.raises(ValueError, match=r"--config.opt.lrr: no such key in the config of .*:vitam"):
    sweep.check_finetune_overrides(runs[1:], ["--config.opt.lrr=3"], str(config))
  with pytest.raises(ValueError, match=r"--config.pairs: no such key .*:rotten_tomatoes"):
    sweep.check_finetune_overrides(runs[:1], ["--config.pairs=True"], str(config))


def test_reuse_links_points_with_the_same_pretraining_config(tmp_path, capsys):
  # Every cpu-scale experiment's baseline is Table 5's mlm_nsp config: pretrained and
  # fine-tuned once, linked from Table 6's tiny row.
  t5, t6 = tmp_path / "t5", tmp_path / "t6"
  data = "data=/corpus"
  assert (
    sweep.run(f"{TABLE5}:scale=gpu,seeds=1,{data}", str(t5), only="mlm_nsp", **_fake_all(tmp_path))
    == []
  )
  capsys.readouterr()
  kwargs = _fake_all(tmp_path)
  assert (
    sweep.run(
      f"{TABLE6}:scale=gpu,seeds=1,{data}", str(t6), only="tiny", reuse=(str(t5),), **kwargs
    )
    == []
  )
  out = capsys.readouterr().out
  assert f"reuse row=tiny,seed=0: {t6 / 'row=tiny,seed=0'} -> {t5 / 'task=mlm_nsp,seed=0'}" in out
  assert os.path.realpath(t6 / "row=tiny,seed=0") == str(t5 / "task=mlm_nsp,seed=0")
  assert len(_calls(t5 / "task=mlm_nsp,seed=0")) == 1  # pretrained once
  assert len(_calls(t5 / "task=mlm_nsp,seed=0" / "finetune" / "vitaminc")) == 1  # fine-tuned once
  assert (t6 / "report.md").exists()
  # data=DIR: every Table 5 row reads DIR/nsp (only the objective changes); other configs have
  # other keys.
  t5m = sweep.load_experiment(TABLE5)
  assert t5m.get_config(f"task=mlm,scale=gpu,seeds=1,{data}").data.dir == "/corpus/nsp"
  assert t5m.get_config(f"task=mlm_nsp,scale=gpu,seeds=1,{data}").data.dir == "/corpus/nsp"
  key = sweep.pretraining_key
  p5, p6 = (
    sweep.expand(TABLE5, f"scale=gpu,seeds=1,{data}")[0],
    sweep.expand(TABLE6, "scale=gpu,seeds=1")[0],
  )
  assert key(TABLE5, p5, []) != key(TABLE6, p6, [])
  assert key(TABLE5, p5, []) != key(TABLE5, p5, ["--config.seed=1"])
  assert (
    sweep.main([f"--experiment={TABLE5}", f"--root={t5}", f"--reuse={t5}", "--backend=slurm"]) == 1
  )
  assert "--reuse links points on this machine: not with --backend=slurm" in capsys.readouterr().err
