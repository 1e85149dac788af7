"""The end-to-end half of tests/unit/test_messages.py (real processes; slow): see its
docstring."""

import json
import re

import pytest
from unit.test_messages import _run


@pytest.mark.slow
def test_text_fields_comma_form_and_majority_baseline(finetuned):
  wd, _, r = finetuned
  assert r.returncode == 0, r.stderr[-3000:]
  config = json.loads((wd / "config.json").read_text())
  assert config["task"]["text_fields"] == ["title", "text"]
  results = json.loads((wd / "results.json").read_text())
  base = results["baseline"]
  assert {k: base[k] for k in ("name", "prediction", "dev", "test")} == {
    "name": "majority class",
    "prediction": "pos",
    "dev": {"accuracy": 1.0},
    "test": {"accuracy": 0.75},
  }
  assert base["at_or_below"]["dev"] == [0]
  test_acc = results["seeds"][0]["test"]["accuracy"]
  assert base["at_or_below"]["test"] == ([0] if test_acc <= 0.75 else [])
  dev_line = [ln for ln in r.stdout.splitlines() if ln.startswith("custom dev accuracy:")]
  assert len(dev_line) == 1 and re.fullmatch(
    r"custom dev accuracy: [01]\.\d{4} ± 0\.0000 \(median .*, 1 seed\); majority class "
    r"1\.0000: the seed is at or below it",
    dev_line[0],
  ), r.stdout[-2000:]
  test_line = [ln for ln in r.stdout.splitlines() if ln.startswith("custom test accuracy:")]
  assert len(test_line) == 1 and "; majority class 0.7500" in test_line[0]


@pytest.mark.slow
def test_convert_prints_its_line_only(workdir, tmp_path):
  r = _run("-m", "bert_jax.convert", f"--src={workdir}", f"--dst={tmp_path / 'hf'}")
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout == f"convert: wrote hf checkpoint {tmp_path / 'hf'}\n"
  info = re.compile(r"^I\d{4} ", re.M)  # absl's INFO lines (orbax logs every read at INFO)
  assert not info.search(r.stderr), r.stderr[:2000]
  # --verbosity still shows them.
  r = _run("-m", "bert_jax.convert", f"--src={workdir}", f"--dst={tmp_path / 'hf2'}", "-v=0")
  assert r.returncode == 0 and info.search(r.stderr)
