"""tools/replication/aot_fit_table.py: the experiment points at paper scale and the table built from
compile results (mocked here: a real TPU compile takes minutes)."""

import importlib
import os
import pathlib
import sys

import pytest

REPO = str(pathlib.Path(__file__).resolve().parents[2])
GiB = 1024**3


def _load():
  sys.path.insert(0, os.path.join(REPO, "tools", "replication"))
  try:
    return importlib.import_module("aot_fit_table")
  finally:
    sys.path.pop(0)


fit = _load()


def test_paper_points_cover_every_experiment_point_at_full_scale():
  points = fit.paper_points()
  names = {(p.experiment, p.name) for p in points}
  assert ("table5_pretraining_tasks", "task=ltr") in names
  assert ("whole_word_masking", "whole_word=True") in names
  assert ("masking_static_vs_dynamic", "mode=dynamic") in names
  assert len([p for p in points if p.experiment == "table6_model_size"]) == 6 + 1
  assert len(points) == 3 + 7 + 2 + 2
  for p in points:
    assert p.config.data.batch_size == 256 and p.config.model.scan_layers
  big = [p for p in points if p.config.data.max_seq_length == 512]
  assert [(p.name, p.config.model.num_layers, p.config.model.hidden_size) for p in big] == [
    ("row=L24_H1024_A16 (256 x 512)", 24, 1024)
  ]
  assert big[0].config.masking.max_predictions == 80
  base = [p for p in points if p.experiment == "table5_pretraining_tasks"][0]
  assert (base.config.model.num_layers, base.config.data.max_seq_length) == (12, 128)


def test_rows_and_table_from_mocked_compiles():
  points = [p for p in fit.paper_points() if p.experiment != "table6_model_size"]
  calls = []

  def compile_fn(config, topology):
    calls.append((config.objective.ltr, config.masking.mode, topology))
    if topology == "v5e-16" and config.objective.ltr:
      raise ValueError(
        "does not fit: v5e-16 mesh {'data': 1, 'fsdp': 16, 'tensor': 1}, batch 256: "
        "RESOURCE_EXHAUSTED: ... required for HLO temporaries (17.25G) exceeds available HBM"
      )
    n = {"v5e-16": 16, "v4-32": 16, "v6e-8": 8}[topology]
    return {"total_bytes": int(1.5 * GiB), "mesh": {"data": 1, "fsdp": n, "tensor": 1}}

  rows = fit.fit_rows(points, ("v5e-16", "v6e-8"), compile_fn)
  assert len(rows) == len(points) * 2
  # mlm_nsp == masking static == whole_word False: BERT-Base compiled once per topology.
  distinct = {"mlm_nsp", "mlm", "ltr", "dynamic", "whole_word=True"}
  assert len(calls) == len(distinct) * 2
  ltr = [r for r in rows if r["point"] == "task=ltr"]
  assert [(r["topology"], r["fits"], r["bytes"], r["mesh"]) for r in ltr] == [
    ("v5e-16", False, 17.25 * GiB, None),
    ("v6e-8", True, 1.5 * GiB, {"data": 1, "fsdp": 8, "tensor": 1}),
  ]
  static = next(r for r in rows if r["point"] == "mode=static" and r["topology"] == "v6e-8")
  assert static["same_as"] == "table5_pretraining_tasks task=mlm_nsp"

  table = fit.format_table(rows, ("v5e-16", "v6e-8"))
  oom = dict(rows[0], bytes=29.05 * GiB, fits=False, mesh=None, error="... HLO temporaries ...")
  assert "| >29.05 / 16 GiB, **does not fit**, mesh - |" in fit.format_table([oom], ("v5e-16",))
  lines = table.splitlines()
  assert lines[0] == "| experiment | point | v5e-16 | v6e-8 | compiled |"
  assert len(lines) == 2 + len(points)
  assert next(ln for ln in lines if "| task=ltr |" in ln) == (
    "| table5_pretraining_tasks | task=ltr | >17.25 / 16 GiB, **does not fit**, mesh data 1 x "
    "fsdp 16 x tensor 1 | "
    "1.50 / 32 GiB, **fits**, mesh data 1 x fsdp 8 x tensor 1 | yes |"
  )
  assert any(
    ln.endswith("| same config as table5_pretraining_tasks task=mlm_nsp |") for ln in lines
  )

  # A rerun given these rows compiles nothing again.
  def no_compile(config, topology):
    raise AssertionError("compiled again")

  again = fit.fit_rows(points, ("v5e-16", "v6e-8"), no_compile, known=rows)
  assert fit.format_table(again, ("v5e-16", "v6e-8")) == table
  # Rendering a stopped run's rows: identical configs share them, nothing is compiled.
  first = fit.fit_rows(points, ("v5e-16", "v6e-8"), None, known=rows[:2])
  assert {(r["point"], r["same_as"]) for r in first} == {
    ("task=mlm_nsp", ""),
    ("mode=static", "table5_pretraining_tasks task=mlm_nsp"),
    ("whole_word=False", "table5_pretraining_tasks task=mlm_nsp"),
  }
  # A partial run (stopped after the first compile) still lists every point.
  partial = fit.format_table(rows[:1], ("v5e-16", "v6e-8"), points).splitlines()
  assert len(partial) == 2 + len(points)
  assert partial[2].endswith("| not compiled | yes |")
  assert partial[3].endswith("| not compiled | not compiled | no |")


def test_other_compile_errors_propagate():
  def broken(config, topology):
    raise ValueError("mesh (1,-1,1) does not divide batch 256")

  with pytest.raises(ValueError, match="does not divide"):
    fit.fit_rows(fit.paper_points()[:1], ("v6e-8",), broken)


def test_sizes_from_does_not_fit_messages():
  assert fit._not_fitting_bytes("does not fit: v5e-16 needs 2.50 GiB per device") == 2.5 * GiB
  xla = "RESOURCE_EXHAUSTED: ... required for HLO temporaries (166.20G) exceeds available HBM"
  assert fit._not_fitting_bytes(xla) == 166.2 * GiB
  assert fit._not_fitting_bytes("does not fit: v5e-16 mesh {}, batch 256: OOM") is None
