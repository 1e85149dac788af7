"""bert_jax.main, the pretraining command: a misspelled config key or a wrongly typed value fails
before the workdir exists. (Every field's rules through the command: test_config_schema.py; real
runs: tests/e2e.)"""

import subprocess
import sys

import pytest

from unit.test_train import ROOT, _env


@pytest.mark.parametrize(
  "flag, message",
  [
    ("--config.model.hiden_size=64", "hiden_size"),
    ("--config.opt.lr=fast", "lr"),
  ],
)
def test_cli_rejects_bad_config_keys(tmp_path, flag, message):
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.main",
      f"--config={ROOT / 'configs' / 'local.py'}",
      f"--workdir={tmp_path / 'wd'}",
      flag,
    ],
    env=_env(),
    capture_output=True,
    text=True,
  )
  assert r.returncode != 0
  lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
  assert message in lines[-1] and len(lines) <= 3, r.stderr
  assert not (tmp_path / "wd").exists()
