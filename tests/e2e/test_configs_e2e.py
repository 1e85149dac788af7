"""The end-to-end half of tests/unit/test_configs.py (real processes; slow): see its
docstring."""

import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from unit.test_configs import NAMES, REPO


@pytest.mark.slow
def test_wheel_ships_configs_data_and_licence(tmp_path):
  """`pip wheel` of a copy of the checkout: configs land in bert_jax/configs, next to the
  bundled corpus and vocab, with LICENSE and NOTICE in the metadata."""
  src = tmp_path / "src"
  src.mkdir()
  for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "NOTICE"):
    shutil.copy(os.path.join(REPO, name), src / name)
  for d in ("bert_jax", "configs"):
    shutil.copytree(os.path.join(REPO, d), src / d, ignore=shutil.ignore_patterns("__pycache__"))
  r = subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
     "-w", str(tmp_path / "dist"), str(src)],
    capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-2000:]
  (wheel,) = glob.glob(str(tmp_path / "dist" / "bert_jax-*.whl"))
  names = set(zipfile.ZipFile(wheel).namelist())
  for name in NAMES:
    assert f"bert_jax/configs/{name}.py" in names
  assert "bert_jax/configs/__init__.py" in names  # importable as bert_jax.configs.NAME
  assert {
    "bert_jax/data/bert-base-uncased-vocab.txt",
    "bert_jax/data/sample_public_domain.txt",
  } <= names
  meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
  text = zipfile.ZipFile(wheel).read(meta).decode()
  assert "License: Apache-2.0" in text and "Provides-Extra: tfds" in text
  assert "Provides-Extra: cuda12" in text and "Provides-Extra: cuda13" in text
  # tensorflow-datasets and matplotlib come only with their extras.
  required = [
    ln for ln in text.splitlines() if ln.startswith("Requires-Dist:") and "extra" not in ln
  ]
  assert "Requires-Dist: jax<0.12,>=0.10.2" in required  # a tested range, not a pin
  assert not any("matplotlib" in ln or "tensorflow-datasets" in ln for ln in required)
  assert any(n.endswith("NOTICE") for n in names) and any(n.endswith("LICENSE") for n in names)
