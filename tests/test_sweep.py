"""launch/sweep.py: point expansion, commands, skipping finished points, one-line errors.

Training itself is exercised in test_experiments.py; here a stand-in main module records
what it was asked to run.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE5 = os.path.join(REPO, "experiments", "table5_pretraining_tasks.py")


def _load_sweep():
  spec = importlib.util.spec_from_file_location("sweep", os.path.join(REPO, "launch", "sweep.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules["sweep"] = module  # dataclasses look their module up while defining
  spec.loader.exec_module(module)
  return module


sweep = _load_sweep()


def test_expand_merges_experiment_arg_and_points():
  points = sweep.expand(TABLE5, "scale=cpu")
  assert [p.name for p in points] == ["task=mlm_nsp", "task=mlm", "task=ltr"]
  assert [p.arg for p in points] == [
    "scale=cpu,task=mlm_nsp",
    "scale=cpu,task=mlm",
    "scale=cpu,task=ltr",
  ]
  # The point wins over the experiment's ARG.
  assert sweep.expand(TABLE5, "task=ltr")[0].arg == "task=mlm_nsp"


def test_dry_run_prints_commands(capsys, tmp_path):
  failed = sweep.run(
    f"{TABLE5}:scale=cpu",
    str(tmp_path),
    ["--config.opt.total_steps=2"],
    only="mlm;task=ltr",
    dry_run=True,
  )
  assert failed == []
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines == [
    f"{sys.executable} -m bert_jax.main --config={TABLE5}:scale=cpu,task=mlm "
    f"--workdir={tmp_path}/task=mlm --config.opt.total_steps=2",
    f"{sys.executable} -m bert_jax.main --config={TABLE5}:scale=cpu,task=ltr "
    f"--workdir={tmp_path}/task=ltr --config.opt.total_steps=2",
  ]
  assert not os.listdir(tmp_path)  # a dry run creates nothing


FAKE_MAIN = """
import json, os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
os.makedirs(args["workdir"], exist_ok=True)
with open(os.path.join(args["workdir"], "calls.jsonl"), "a") as f:
  f.write(json.dumps(args) + "\\n")
sys.exit(1 if "task=mlm," in args["config"] + "," else 0)
"""


def test_runs_points_skips_finished_and_reports_failures(tmp_path, capsys):
  (tmp_path / "fake_main.py").write_text(FAKE_MAIN)
  env = {**os.environ, "PYTHONPATH": str(tmp_path)}
  root = tmp_path / "root"
  kwargs = dict(overrides=["--config.seed=3"], env=env, main_module="fake_main")
  failed = sweep.run(f"{TABLE5}:scale=cpu", str(root), **kwargs)
  assert failed == ["task=mlm"]  # the fake main fails this one; the others still ran
  calls = [json.loads(x) for x in (root / "task=ltr" / "calls.jsonl").read_text().splitlines()]
  assert calls == [
    {
      "config": f"{TABLE5}:scale=cpu,task=ltr",
      "workdir": str(root / "task=ltr"),
      "config.seed": "3",
    }
  ]
  assert (root / "task=ltr" / sweep.DONE).exists()
  assert not (root / "task=mlm" / sweep.DONE).exists()
  # Second pass: finished points are skipped, the failed one is retried.
  capsys.readouterr()
  assert sweep.run(f"{TABLE5}:scale=cpu", str(root), **kwargs) == ["task=mlm"]
  out = capsys.readouterr().out
  assert "skip task=mlm_nsp: finished" in out and "skip task=ltr: finished" in out
  assert len((root / "task=ltr" / "calls.jsonl").read_text().splitlines()) == 1
  assert len((root / "task=mlm" / "calls.jsonl").read_text().splitlines()) == 2


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
  r = cli(f"--experiment={TABLE5}:scale=cpu", f"--root={tmp_path}", "--dry_run")
  assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 3
