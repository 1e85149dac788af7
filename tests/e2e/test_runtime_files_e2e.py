"""The end-to-end half of tests/unit/test_runtime_files.py (real processes; slow): see its
docstring."""

import json
import os
import pathlib
import subprocess

import pytest
from unit.test_runtime_checkpoints import _truncate_largest
from unit.test_runtime_files import _rows
from unit.test_train import ROOT, _env, _main_cmd

from bert_jax import api
from bert_jax.runtime import checkpoints as ckpt_lib


def _run_on_fake_gcs(store, cwd, data_dir, steps, extra=()):
  cmd = _main_cmd("gs://bucket/run", data_dir, steps, list(extra))
  cmd[1:3] = [str(ROOT / "tests" / "fake_gcs.py"), str(store), "bert_jax.main"]
  env = _env(PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
  return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_train_and_resume_on_gs_workdir(tiny_data_dir, tmp_path, caplog):
  store, cwd = tmp_path / "store", tmp_path / "cwd"
  store.mkdir()
  cwd.mkdir()
  r = _run_on_fake_gcs(store, cwd, tiny_data_dir, 8, ["--config.opt.total_steps=4"])
  assert r.returncode == 0, r.stderr[-3000:]
  r = _run_on_fake_gcs(store, cwd, tiny_data_dir, 8)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "Resumed from gs://bucket/run/checkpoints at step 4" in r.stdout

  assert os.listdir(cwd) == []  # no ./gs:/bucket/run, nothing else local either
  run = store / "bucket" / "run"
  assert sorted(os.listdir(run)) == [
    "checkpoints",
    "config.json",
    "config_changes.jsonl",
    "metrics.jsonl",
    "run_status.json",
    "tb",
    "tokenizer",
  ]  # the lock is gone
  assert json.loads((run / "config.json").read_text())["opt"]["total_steps"] == 4
  changes = [json.loads(ln) for ln in (run / "config_changes.jsonl").read_text().splitlines()]
  assert changes == [{"step": 4, "changes": {"opt.total_steps": [4, 8]}}]
  assert [r["step"] for r in _rows((run / "metrics.jsonl").read_text())] == list(range(1, 9))
  assert json.loads((run / "run_status.json").read_text()) == {
    "state": "finished",
    "step": 8,
    "total_steps": 8,
  }
  assert len(os.listdir(run / "tb")) == 2 and all(
    n.startswith("events.out.tfevents.") and (run / "tb" / n).stat().st_size > 0
    for n in os.listdir(run / "tb")
  )  # one per run, copied from a local temporary dir
  assert (run / "tokenizer" / "vocab.txt").read_text() == (
    pathlib.Path(tiny_data_dir, "tokenizer", "vocab.txt")
  ).read_text()
  # orbax's checkpoints (TensorStore array bytes included) are in the store: keep=2.
  assert sorted(os.listdir(run / "checkpoints")) == ["4", "8"]
  meta, step, _ = ckpt_lib.read_meta(str(run))
  assert step == 8 and meta["config"]["opt"]["total_steps"] == 8

  # bert_jax.load on a workdir whose latest checkpoint is corrupt falls back, as the trainer.
  _truncate_largest(run / "checkpoints" / "8")
  m = api.load(str(run))
  assert m.step == 4
  # One warning of ours (orbax adds its notices about read-only managers).
  warnings = [
    r.getMessage() for r in caplog.records if r.pathname.endswith("bert_jax/runtime/checkpoints.py")
  ]
  assert len(warnings) == 1, warnings
  assert f"checkpoint {run}/checkpoints/8 does not restore" in warnings[0]
  assert "trying step 4" in warnings[0]
