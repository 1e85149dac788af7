"""launch/sweep.py: point expansion, commands, skipping finished points, one-line errors.

Training itself is exercised in test_experiments.py; here a stand-in main module records
what it was asked to run. The experiments run at scale=gpu,seeds=1 here: the reduced scale with the
whole downstream suite (4 tasks) and Table 6's four rows (cpu leaves out vitaminc and mini).
"""

import importlib.util
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import pytest

REPO = str(pathlib.Path(__file__).resolve().parents[2])
TABLE5 = os.path.join(REPO, "experiments", "table5_pretraining_tasks.py")


def _load_sweep():
  spec = importlib.util.spec_from_file_location("sweep", os.path.join(REPO, "launch", "sweep.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules["sweep"] = module  # dataclasses look their module up while defining
  spec.loader.exec_module(module)
  return module


sweep = _load_sweep()


def test_only_names_points_by_some_of_their_values():
  points = sweep.expand(TABLE5, "scale=gpu")  # 3 pretraining seeds a row
  assert [p.name for p in sweep._selected(points, "mlm")] == [
    "task=mlm,seed=0", "task=mlm,seed=1", "task=mlm,seed=2"
  ]  # fmt: skip
  assert [p.name for p in sweep._selected(points, "task=ltr,seed=1;mlm_nsp,2")] == [
    "task=ltr,seed=1", "task=mlm_nsp,seed=2"
  ]  # fmt: skip
  with pytest.raises(ValueError, match="--only=nsp: no such point"):
    sweep._selected(points, "nsp")  # a value, not a part of one


def test_expand_merges_experiment_arg_and_points():
  points = sweep.expand(TABLE5, "scale=gpu,seeds=1")
  assert [p.name for p in points] == ["task=mlm_nsp,seed=0", "task=mlm,seed=0", "task=ltr,seed=0"]
  assert [p.arg for p in points] == [
    "scale=gpu,seeds=1,task=mlm_nsp,seed=0",
    "scale=gpu,seeds=1,task=mlm,seed=0",
    "scale=gpu,seeds=1,task=ltr,seed=0",
  ]
  # The point wins over the experiment's ARG.
  assert sweep.expand(TABLE5, "task=ltr,seed=0")[0].arg == "task=mlm_nsp,seed=0"


def test_dry_run_prints_commands(capsys, tmp_path):
  failed = sweep.run(
    f"{TABLE5}:scale=gpu,seeds=1",
    str(tmp_path),
    ["--config.opt.total_steps=2"],
    only="mlm;task=ltr,seed=0",
    dry_run=True,
    stages=("pretrain",),
  )
  assert failed == []
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines == [
    f"{sys.executable} -m bert_jax.main --config={TABLE5}:scale=gpu,seeds=1,task=mlm,seed=0 "
    f"--workdir={tmp_path}/task=mlm,seed=0 --config.opt.total_steps=2",
    f"{sys.executable} -m bert_jax.main --config={TABLE5}:scale=gpu,seeds=1,task=ltr,seed=0 "
    f"--workdir={tmp_path}/task=ltr,seed=0 --config.opt.total_steps=2",
  ]
  assert not os.listdir(tmp_path)  # a dry run creates nothing


FAKE_MAIN = """
import json, os, signal, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
os.makedirs(args["workdir"], exist_ok=True)
with open(os.path.join(args["workdir"], "calls.jsonl"), "a") as f:
  f.write(json.dumps(args) + "\\n")
task = args["config"].rsplit("task=", 1)[1].split(",")[0]
mode = json.loads(os.environ.get("FAKE_MODES", "{}")).get(task, "finish")

def status(state, code):
  with open(os.path.join(args["workdir"], "run_status.json"), "w") as f:
    json.dump({"state": state, "step": 1, "total_steps": 2}, f)
  sys.exit(code)

if mode == "wait_for_signal":  # like the trainer: save on SIGTERM, exit 75
  signal.signal(signal.SIGTERM, lambda *a: status("preempted", 75))
  open(os.path.join(args["workdir"], "started"), "w").close()
  time.sleep(60)
if mode == "preempted":
  status("preempted", 75)
if mode == "finish":
  status("finished", 0)
sys.exit(0 if mode == "exit_0_unfinished" else 1)
"""


def _fake(tmp_path, **modes):
  (tmp_path / "fake_main.py").write_text(FAKE_MAIN)
  env = {**os.environ, "PYTHONPATH": str(tmp_path), "FAKE_MODES": json.dumps(modes)}
  return dict(overrides=["--config.seed=3"], env=env, main_module="fake_main", stages=("pretrain",))


def _calls(workdir):
  return [json.loads(x) for x in (workdir / "calls.jsonl").read_text().splitlines()]


def test_runs_points_skips_finished_and_reports_failures(tmp_path, capsys):
  root = tmp_path / "root"
  kwargs = _fake(tmp_path, mlm="fail", ltr="exit_0_unfinished")
  failed = sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), **kwargs)
  # Exit 0 without the run's own record of reaching its last step is not finished either.
  assert failed == ["task=mlm,seed=0", "task=ltr,seed=0"]
  assert _calls(root / "task=mlm_nsp,seed=0") == [
    {
      "config": f"{TABLE5}:scale=gpu,seeds=1,task=mlm_nsp,seed=0",
      "workdir": str(root / "task=mlm_nsp,seed=0"),
      "config.seed": "3",
    }
  ]
  assert (root / "task=mlm_nsp,seed=0" / sweep.DONE).exists()
  assert not (root / "task=mlm,seed=0" / sweep.DONE).exists()
  assert not (root / "task=ltr,seed=0" / sweep.DONE).exists()
  # Second pass: finished points are skipped, the failed ones are retried.
  capsys.readouterr()
  kwargs = _fake(tmp_path, mlm="fail")
  assert sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), **kwargs) == ["task=mlm,seed=0"]
  out = capsys.readouterr().out
  assert "skip task=mlm_nsp,seed=0: finished" in out and "skip task=ltr,seed=0: finished" not in out
  assert len(_calls(root / "task=mlm_nsp,seed=0")) == 1
  assert len(_calls(root / "task=mlm,seed=0")) == len(_calls(root / "task=ltr,seed=0")) == 2
  assert (root / "task=ltr,seed=0" / sweep.DONE).exists()


def test_preempted_point_is_never_done_and_stops_the_sweep(tmp_path, capsys):
  root = tmp_path / "root"
  with pytest.raises(sweep.Preempted, match=r"task=mlm,seed=0 was preempted \(exit 75\)"):
    sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), **_fake(tmp_path, mlm="preempted"))
  assert (root / "task=mlm_nsp,seed=0" / sweep.DONE).exists()
  assert not (root / "task=mlm,seed=0" / sweep.DONE).exists()
  assert not (root / "task=ltr,seed=0").exists()  # the sweep stopped at the preempted point
  # The rerun resumes the preempted point and goes on.
  assert sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), **_fake(tmp_path)) == []
  assert (
    len(_calls(root / "task=mlm,seed=0")) == 2 and len(_calls(root / "task=mlm_nsp,seed=0")) == 1
  )
  assert all((root / n / sweep.DONE).exists() for n in ("task=mlm,seed=0", "task=ltr,seed=0"))


def test_sigterm_to_the_sweep_reaches_the_point_and_exits_preempted(tmp_path):
  """A real signal: the sweep passes SIGTERM on to the running point (which saves, exits 75),
  marks nothing done and exits 75 itself."""
  root = tmp_path / "root"
  kwargs = _fake(tmp_path, mlm_nsp="wait_for_signal")
  code = (
    f"import sys; sys.path.insert(0, {os.path.join(REPO, 'launch')!r}); import sweep\n"
    f"sys.argv = ['sweep.py']\n"
    f"try:\n  sweep.run({TABLE5 + ':scale=gpu,seeds=1'!r}, {str(root)!r}, main_module='fake_main',"
    " stages=('pretrain',))\n"
    f"except sweep.Preempted as e:\n  print(e); sys.exit(sweep.preemption.EXIT_PREEMPTED)\n"
  )
  proc = subprocess.Popen(
    [sys.executable, "-c", code], env=kwargs["env"], stdout=subprocess.PIPE, text=True
  )
  deadline = time.time() + 60
  while not (root / "task=mlm_nsp,seed=0" / "started").exists() and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=60)
  assert proc.returncode == 75
  assert "task=mlm_nsp,seed=0 was preempted (exit 75): rerun the sweep to resume" in out
  status = json.loads((root / "task=mlm_nsp,seed=0" / "run_status.json").read_text())
  assert status["state"] == "preempted"
  assert (
    not (root / "task=mlm_nsp,seed=0" / sweep.DONE).exists()
    and not (root / "task=mlm,seed=0").exists()
  )


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such file"):
    sweep.expand(str(tmp_path / "missing.py"))
  no_sweep = tmp_path / "no_sweep.py"
  no_sweep.write_text("def get_config(arg=None):\n  return None\n")
  with pytest.raises(ValueError, match=r"no_sweep.py defines no sweep\(\)"):
    sweep.expand(str(no_sweep))
  bad_point = tmp_path / "bad_point.py"
  bad_point.write_text(
    f"import importlib.util\nspec = importlib.util.spec_from_file_location('t5', {TABLE5!r})\n"
    "t5 = importlib.util.module_from_spec(spec); spec.loader.exec_module(t5)\n"
    "get_config = t5.get_config\n"
    "def sweep(add):\n  add(task='mlm')\n  add(task='bilstm')\n"
  )
  with pytest.raises(ValueError, match="sweep point task=bilstm: task must be one of"):
    sweep.expand(str(bad_point))
  with pytest.raises(ValueError, match=r"--config.opt.totl: no such key"):
    sweep.run(TABLE5, str(tmp_path), ["--config.opt.totl=3"], dry_run=True)
  with pytest.raises(ValueError, match="--only=nsp: no such point"):
    sweep.run(TABLE5, str(tmp_path), only="nsp", dry_run=True)


def test_cli_one_line_errors(tmp_path):
  def cli(*args):
    return subprocess.run(
      [sys.executable, os.path.join(REPO, "launch", "sweep.py"), *args],
      capture_output=True,
      text=True,
      timeout=120,
    )

  r = cli(f"--experiment={tmp_path}/nope.py", f"--root={tmp_path}")
  assert r.returncode == 1
  assert r.stderr.strip().splitlines() == [f"error: --experiment: no such file {tmp_path}/nope.py"]
  r = cli(f"--root={tmp_path}")
  assert r.returncode == 1 and r.stderr.strip() == "error: --experiment is required"
  r = cli(
    f"--experiment={TABLE5}:scale=gpu,seeds=1",
    f"--root={tmp_path}",
    "--dry_run",
    "--stages=pretrain",
  )
  assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 3
  r = cli(f"--experiment={TABLE5}", f"--root={tmp_path}", "--stages=pretrain,eval")
  assert r.returncode == 1
  assert r.stderr.strip() == "error: --stages=pretrain,eval: choose from pretrain,finetune,report"
  r = cli(f"--experiment={TABLE5}", f"--root={tmp_path}", "--backend=k8s")
  assert r.stderr.strip() == "error: --backend=k8s: choose from local, slurm, tpu_vm"


# ----------------------------------------------------------------------------- fine-tuning

TASKS = ["squad_qnli", "brown_pos", "rotten_tomatoes", "vitaminc", "squad_split"]


def test_dry_run_lists_pretraining_then_finetuning_then_report(capsys, tmp_path):
  assert sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(tmp_path), only="ltr", dry_run=True) == []
  lines = capsys.readouterr().out.strip().splitlines()
  # ltr: its pretraining, 5 tasks, the same 5 with a BiLSTM (row task=ltr_bilstm,seed=0), report.
  assert len(lines) == 1 + 5 + 5 + 1
  assert lines[0].split()[2] == "bert_jax.main"
  init = f"--config.init={tmp_path}/task=ltr,seed=0"
  finetune = os.path.join(REPO, "configs", "finetune.py")
  for line, task in zip(lines[1:11], TASKS + TASKS, strict=True):
    argv = line.split()
    assert argv[1:5] == ["-m", "bert_jax.finetune", f"--config={finetune}:{task}", init]
    assert "--config.seeds=2" in argv and "--config.opt.epochs=3" in argv
    # Selection on dev over the lr grid.
    assert "--config.grid.lr=(0.001, 0.0003)" in shlex.split(line)
  for line, task in zip(lines[1:6], TASKS, strict=True):
    assert f"--workdir={tmp_path}/task=ltr,seed=0/finetune/{task}" in line.split()
    assert "bilstm" not in line
  for line, task in zip(lines[6:11], TASKS, strict=True):
    argv = line.split()
    assert f"--workdir={tmp_path}/task=ltr_bilstm,seed=0/finetune/{task}" in argv
    assert "--config.head.bilstm=True" in argv
  assert lines[-1] == f"{sys.executable} -m bert_jax.report --root={tmp_path} --paper=table5"
  assert not os.listdir(tmp_path)


FAKE_FINETUNE = """
import json, os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
os.makedirs(args["workdir"], exist_ok=True)
with open(os.path.join(args["workdir"], "calls.jsonl"), "a") as f:
  f.write(json.dumps(args) + "\\n")
task = args["config"].rsplit(":", 1)[1]
mode = json.loads(os.environ.get("FAKE_FT_MODES", "{}")).get(task, "finish")
if mode == "finish":
  with open(os.path.join(args["workdir"], "results.json"), "w") as f:
    json.dump({"task": task}, f)
sys.exit({"finish": 0, "no_results": 0, "preempted": 75, "fail": 1}[mode])
"""

FAKE_REPORT = """
import sys
root = sys.argv[1].split("=", 1)[1]
open(root + "/report.md", "a").write("report\\n")
"""


def _fake_all(tmp_path, **ft_modes):
  kwargs = _fake(tmp_path)
  (tmp_path / "fake_finetune.py").write_text(FAKE_FINETUNE)
  (tmp_path / "fake_report.py").write_text(FAKE_REPORT)
  kwargs["env"]["FAKE_FT_MODES"] = json.dumps(ft_modes)
  kwargs.update(
    stages=sweep.STAGES,
    finetune_overrides=["--config.opt.epochs=1"],
    finetune_module="fake_finetune",
    report_module="fake_report",
  )
  return kwargs


def test_finetuning_runs_after_pretraining_and_resumes(tmp_path, capsys):
  root = tmp_path / "root"
  kwargs = _fake_all(tmp_path, squad_split="no_results", brown_pos="fail")
  failed = sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), only="mlm;ltr", **kwargs)
  # Exit 0 without results.json is not finished; nor is a failed run; no report then.
  rows = ["task=mlm,seed=0", "task=ltr,seed=0", "task=ltr_bilstm,seed=0"]
  assert failed == [f"{r}/finetune/{t}" for r in rows for t in ("brown_pos", "squad_split")]
  assert not (root / "report.md").exists()
  assert "no report: 6 run(s) failed" in capsys.readouterr().out
  call = _calls(root / "task=ltr_bilstm,seed=0" / "finetune" / "vitaminc")[0]
  assert call["config.init"] == str(root / "task=ltr,seed=0")  # no pretraining of its own
  assert call["config.head.bilstm"] == "True" and call["config.opt.epochs"] == "1"
  assert not (root / "task=ltr_bilstm,seed=0" / sweep.DONE).exists()
  for r in rows:
    for t in TASKS:
      done = (root / r / "finetune" / t / sweep.DONE).exists()
      assert done == (t not in ("brown_pos", "squad_split")), (r, t)
  # The rerun runs only what is not done, then the report.
  assert (
    sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), only="mlm;ltr", **_fake_all(tmp_path)) == []
  )
  for r in rows:
    assert len(_calls(root / r / "finetune" / "rotten_tomatoes")) == 1
    assert len(_calls(root / r / "finetune" / "brown_pos")) == 2
  assert len(_calls(root / "task=ltr,seed=0")) == 1  # pretraining ran once
  assert (root / "report.md").read_text() == "report\n"


def test_preempted_finetuning_stops_the_sweep_unmarked(tmp_path):
  root = tmp_path / "root"
  kwargs = _fake_all(tmp_path, vitaminc="preempted")
  with pytest.raises(sweep.Preempted, match=r"task=mlm_nsp,seed=0/finetune/vitaminc was preempted"):
    sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(root), **kwargs)
  assert (root / "task=mlm_nsp,seed=0" / "finetune" / "rotten_tomatoes" / sweep.DONE).exists()
  assert not (root / "task=mlm_nsp,seed=0" / "finetune" / "vitaminc" / sweep.DONE).exists()
  assert not (root / "task=mlm,seed=0").exists() and not (root / "report.md").exists()


def test_finetune_stage_alone_needs_pretrained_points(tmp_path):
  kwargs = _fake_all(tmp_path)
  kwargs["stages"] = ("finetune",)
  assert sweep.run(f"{TABLE5}:scale=gpu,seeds=1", str(tmp_path / "r"), only="mlm", **kwargs) == [
    "task=mlm,seed=0"
  ]


# ----------------------------------------------------------------------------- control, deadline


def test_control_runs_from_a_random_init_and_is_reused_between_experiments(tmp_path, capsys):
  """The baseline's suite adds the no-pretraining control: no --config.init=<point>, the
  point's tokenizer; run once, then linked into another experiment with --reuse."""
  t5, wwm = tmp_path / "t5", tmp_path / "wwm"
  data = "data=/corpus"
  WWM = os.path.join(REPO, "experiments", "whole_word_masking.py")
  assert (
    sweep.run(f"{TABLE5}:scale=gpu,seeds=1,{data}", str(t5), only="mlm_nsp", dry_run=True) == []
  )
  lines = capsys.readouterr().out.strip().splitlines()
  control = [ln for ln in lines if "pretraining=none,seed=0" in ln]
  assert len(lines) == 1 + 5 + 5 + 1 and len(control) == 5
  for line in control:
    argv = line.split()
    assert f"--config.init={t5}/task=mlm_nsp,seed=0" not in argv and "--config.init=" in argv
    assert f"--config.data.vocab={t5}/task=mlm_nsp,seed=0/tokenizer" in argv
    assert "--config.model.vocab_size=4096" in argv and "--config.model.num_layers=2" in argv
  tok = t5 / "task=mlm_nsp,seed=0" / "tokenizer"
  tok.mkdir(parents=True)
  (tok / "vocab.txt").write_text("[PAD]\n")
  assert (
    sweep.run(f"{TABLE5}:scale=gpu,seeds=1,{data}", str(t5), only="mlm_nsp", **_fake_all(tmp_path))
    == []
  )
  call = _calls(t5 / "pretraining=none,seed=0" / "finetune" / "vitaminc")[0]
  assert call["config.init"] == "" and call["config.data.vocab"] == str(tok)
  done = json.load(open(t5 / "pretraining=none,seed=0" / "finetune" / "vitaminc" / sweep.DONE))
  assert len(done["key"]) == 64
  capsys.readouterr()
  kwargs = _fake_all(tmp_path)
  assert (
    sweep.run(f"{WWM}:scale=gpu,seeds=1,{data}", str(wwm), only="False", reuse=(str(t5),), **kwargs)
    == []
  )
  out = capsys.readouterr().out
  assert (
    "reuse pretraining=none,seed=0/finetune/vitaminc: -> "
    f"{t5}/pretraining=none,seed=0/finetune/vitaminc" in out
  )
  assert len(_calls(t5 / "pretraining=none,seed=0" / "finetune" / "vitaminc")) == 1  # ran once
  # Another vocabulary is another control.
  (tok / "vocab.txt").write_text("[PAD]\n[UNK]\n")
  other = sweep.FinetuneRun(
    "task=mlm_nsp,seed=0",
    "vitaminc",
    "pretraining=none,seed=0",
    ("--config.init=", "--config.data.vocab={point}/tokenizer"),
    False,
  )
  assert sweep.finetune_key(other, str(t5), []) != done["key"]


def test_deadline_stops_the_run_in_flight_and_reports_what_finished(tmp_path, capsys):
  root = tmp_path / "root"
  experiment = f"{TABLE5}:scale=gpu,seeds=1"
  assert sweep.run(experiment, str(root), only="mlm_nsp", **_fake_all(tmp_path)) == []
  (root / "report.md").unlink()
  kwargs = _fake_all(tmp_path)
  kwargs["env"]["FAKE_MODES"] = json.dumps({"mlm": "wait_for_signal"})
  t0 = time.time()
  with pytest.raises(sweep.PastDeadline, match="not done by the deadline"):
    sweep.run(experiment, str(root), deadline=time.time() + 5, **kwargs)
  assert time.time() - t0 < 50  # the waiting point was stopped, not waited for (60 s)
  out = capsys.readouterr().out
  # mlm got SIGTERM at the deadline (it saves and exits); nothing after it started.
  assert (
    not (root / "task=mlm,seed=0" / sweep.DONE).exists() and not (root / "task=ltr,seed=0").exists()
  )
  record = json.load(open(root / sweep.DEADLINE))
  assert record["stopped"] == "task=mlm,seed=0"
  assert record["not_done"][:2] == ["task=mlm,seed=0", "task=mlm,seed=0/finetune/squad_qnli"]
  assert record["not_done"][-1] == "task=ltr_bilstm,seed=0/finetune/squad_split"
  assert "task=mlm_nsp,seed=0" not in " ".join(record["not_done"])
  assert (
    f"deadline: task=mlm,seed=0 was stopped or not started; {len(record['not_done'])} run(s)" in out
  )
  assert len(record["not_done"]) == 1 + 5 + 1 + 5 + 5
  assert (root / "report.md").read_text() == "report\n"  # the report of what finished
  # A rerun without a deadline finishes the rest and clears the record.
  assert sweep.run(experiment, str(root), **_fake_all(tmp_path)) == []
  assert not (root / sweep.DEADLINE).exists()
  assert (
    len(_calls(root / "task=mlm_nsp,seed=0")) == 1
    and (root / "task=ltr,seed=0" / sweep.DONE).exists()
  )


def test_past_deadline_starts_nothing_and_cli_exits_75(tmp_path, capsys):
  root = tmp_path / "root"
  assert (
    sweep.main(
      [
        f"--experiment={TABLE5}:scale=gpu,seeds=1",
        f"--root={root}",
        "--deadline=1",
        "--stages=pretrain",
      ]
    )
    == 75
  )
  assert (
    "deadline: 3 run(s) not done by the deadline; rerun the sweep to finish"
    in capsys.readouterr().err
  )
  assert json.load(open(root / sweep.DEADLINE))["not_done"] == [
    "task=mlm_nsp,seed=0",
    "task=mlm,seed=0",
    "task=ltr,seed=0",
  ]
  assert sweep.main([f"--experiment={TABLE5}", f"--root={root}", "--deadline=soon"]) == 1
  assert "--deadline=soon: not a number of seconds" in capsys.readouterr().err
