"""tools/gpu/tune_kernels.py through `tools/gpu/device_run.sh --tune`, run here at toy size
(`--smoke`: the flash kernels in Pallas' interpreter): every record it writes for the GPU call,
the flash tiles computing the same attention, the GELU variants' gradients and temporaries, the
init's compile and a cold build with its step time."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from lab._benchmark import DEVICE_RUN

pytestmark = pytest.mark.lab


def test_the_tuning_call_measures_every_kernel_choice_at_toy_size(tmp_path):
  out = tmp_path / "out"
  env = {**os.environ, "OUT": str(out), "WHEELS": "", "PYTHON": sys.executable}
  proc = subprocess.run(
    ["bash", DEVICE_RUN, "--tune", "--smoke"], env=env, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert {p.name for p in out.iterdir()} == {"env.txt", "tune.jsonl", "tune.log"}
  recs = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
  # cuDNN's attention (a reference beside the flash kernels) cannot run on the CPU: its error
  # is a record and the call goes on.
  errors = [r for r in recs if r["kind"] in ("error", "skipped")]
  assert [(r["config"], "cuDNN" in r["error"]) for r in errors] == [("cudnn, no dropout", True)]
  by_kind = {}
  for r in recs:
    by_kind.setdefault(r["kind"], []).append(r)

  flash = {r["config"]: r for r in by_kind["flash"]}
  # Five settings (one with the one-pass backward), then the fastest fields per kernel
  # combined ("best", where any beat the default); each the default's attention and
  # gradients (the same hash mask).
  assert {"default", "kv1p64x32", "f128x64", "kv128x32w8", "q64x16"} <= set(flash)
  for r in flash.values():
    assert r["max_diff"] <= 2e-2 and r["fwd_ms"] > 0 and r["total_ms"] > r["fwd_ms"], r

  refs = {r["config"]: r for r in by_kind["attention_ref"]}
  assert set(refs) == {"flash, no dropout", "explicit, hash dropout"}
  assert all(r["total_ms"] > 0 for r in refs.values())

  gelu = {r["gelu"]: r for r in by_kind["gelu"]}
  assert set(gelu) == {"autodiff", "checkpoint", "recomputed"}
  # remat_policy='gelu' (layer_scan.recomputed_gelu): autodiff's gradients to bf16 rounding
  # (its derivative is computed in float32), and fewer temporaries than autodiff keeps.
  assert gelu["recomputed"]["grad_rel_diff"] < 1e-2
  for name in ("checkpoint", "recomputed"):
    assert gelu[name]["temp_gib"] < gelu["autodiff"]["temp_gib"], gelu

  (init,) = by_kind["init"]
  assert init["compile_s"] > 0 and init["checksum"] > 0
  (build,) = by_kind["build"]
  assert build["build_s"] >= build["lower_s"] > 0 and build["step_ms"] > 0
  assert math.isfinite(build["loss_last"])
  assert by_kind["env"][0]["devices"] == ["cpu"]


def test_an_unknown_case_is_refused_before_anything_runs():
  proc = subprocess.run(
    [sys.executable, "tools/gpu/tune_kernels.py", "--smoke", "--only=flash,flsh"],
    cwd=pathlib.Path(DEVICE_RUN).parents[2], capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == 2
  assert "--only: unknown flsh; choose from build,flash,gelu,init" in proc.stderr
  assert "tune.jsonl" not in proc.stdout and '"kind"' not in proc.stdout
