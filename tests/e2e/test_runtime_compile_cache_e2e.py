"""The end-to-end half of tests/unit/test_runtime_compile_cache.py (real processes; slow): see its
docstring."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from bert_jax.benchmark import protocol

REPO = str(pathlib.Path(__file__).resolve().parents[2])


def _worker(cache_flag: str) -> dict:
  """The benchmark's one-measurement worker (the CLI, so cli.run's cache hook runs) on a tiny
  pretraining step."""
  spec = dict(size="tiny", seq=32, batch=2, dtype="float32", steps=1, warmup=1, peak=False)
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # conftest's session cache: not this test's
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.benchmark", "--worker=" + json.dumps(spec), cache_flag],
    capture_output=True, text=True, timeout=600, env=env, cwd=REPO,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-2000:]
  (line,) = [x for x in r.stdout.splitlines() if x.startswith(protocol.RESULT_MARK)]
  return json.loads(line[len(protocol.RESULT_MARK) :])


@pytest.mark.slow
def test_second_process_loads_the_train_step_from_the_cache(tmp_path):
  cache = tmp_path / "jax_cache"
  first = _worker(f"--compilation_cache_dir={cache}")
  entries = sorted(os.listdir(cache))
  assert first["compile_cache_hit"] is False
  assert any("jit_train_step" in e or "train_step" in e for e in entries), entries
  second = _worker(f"--compilation_cache_dir={cache}")
  assert second["compile_cache_hit"] is True
  # The cached executable is the same program: same losses, bit for bit.
  assert second["losses"] == first["losses"]
  off = _worker("--compilation_cache_dir=none")
  assert off["compile_cache_hit"] is None
  assert off["losses"] == first["losses"]
