"""bert_jax.report.plots: which figures a set of runs gets (loss curves per split, per-task bars,
score vs size only when sizes differ), written whole, and the missing-matplotlib error."""

import os
import sys

import pytest

from bert_jax.report import plots
from bert_jax.report import runs as runs_lib
from unit import _report_runs
from unit._report_runs import _seeded_root, _size_config, _write_run

# Shared fixtures (tests/unit/_report_runs.py).
finetune_root = _report_runs.finetune_root
sweep_root = _report_runs.sweep_root

PNG = b"\x89PNG\r\n\x1a\n"


def _names(paths):
  return [os.path.basename(p) for p in paths]


def _is_png(path):
  with open(path, "rb") as f:
    return f.read(8) == PNG


def test_loss_curves_one_figure_per_split_that_has_rows(sweep_root, tmp_path_factory):
  runs = runs_lib.find_runs(sweep_root)
  out = tmp_path_factory.mktemp("plots")
  written = plots.plot(runs, str(out))
  assert _names(written) == ["train_loss.png", "train_lm_loss.png", "eval_loss.png"]
  assert all(_is_png(p) for p in written)
  assert sorted(os.listdir(out)) == sorted(_names(written))  # no temporary file left behind
  # No eval rows: no eval figure.
  only = tmp_path_factory.mktemp("only")
  _write_run(str(only), "r", {"seed": 0}, [{"step": 1, "split": "train", "ltr_loss": 6.0}])
  out = tmp_path_factory.mktemp("out")
  assert _names(plots.plot(runs_lib.find_runs(str(only)), str(out))) == [
    "train_loss.png",
    "train_lm_loss.png",
  ]


def test_finetune_bars_and_score_vs_size_only_when_sizes_differ(finetune_root, tmp_path):
  runs = runs_lib.find_runs(finetune_root)
  ft = runs_lib.find_finetune_runs(finetune_root)
  # Both points have the same model: bars per task, no size figure.
  written = plots.plot_finetune(runs, ft, str(tmp_path))
  assert _names(written) == ["finetune_tasks.png"] and _is_png(written[0])
  sizes = {
    "row=small": (_size_config(1, 32), [60.0, 61.0], [[0.70, 0.71], [0.72, 0.70]]),
    "row=big": (_size_config(4, 64), [30.0, 31.0], [[0.80, 0.82], [0.81, 0.81]]),
  }
  root = _seeded_root(tmp_path / "sizes", sizes)
  out = tmp_path / "out"
  out.mkdir()
  written = plots.plot_finetune(
    runs_lib.find_runs(root), runs_lib.find_finetune_runs(root), str(out)
  )
  assert _names(written) == ["finetune_tasks.png", "finetune_vs_size.png"]
  assert all(_is_png(p) for p in written)
  # A split no run has numbers for: nothing to draw, nothing written.
  ft = runs_lib.find_finetune_runs(root)
  for r in ft:
    r.results.pop("dev", None)
    for seed in r.results["seeds"]:
      seed.pop("dev")
  empty = tmp_path / "empty"
  empty.mkdir()
  assert plots.plot_finetune(runs_lib.find_runs(root), ft, str(empty), split="dev") == []
  assert not os.listdir(empty)


def test_without_matplotlib_the_error_names_the_extra(sweep_root, tmp_path_factory, monkeypatch):
  out = tmp_path_factory.mktemp("plots")
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  want = r"^plots need matplotlib: pip install 'bert_jax\[plots\]'$"
  with pytest.raises(ImportError, match=want):
    plots.plot(runs_lib.find_runs(sweep_root), str(out))
  assert not os.listdir(out)
