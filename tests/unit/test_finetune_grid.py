"""bert_jax.finetune.grid: the grid runs every point and selects the best mean dev score."""

import json
import os

from bert_jax import finetune
from bert_jax.finetune import grid as ft_grid
from unit._finetune_tasks import finetune_config


def test_grid_selects_the_best_mean_dev_point(tmp_path, monkeypatch):
  seen = []

  def fake_run_point(c, wd):
    seen.append((c.opt.lr, c.data.batch_size, c.opt.epochs, os.path.basename(wd)))
    score = {5e-5: 0.8, 3e-5: 0.9, 2e-5: 0.7}[c.opt.lr] - 0.01 * c.opt.epochs
    s = {"mean": score, "std": 0.0, "median": score, "min": score, "max": score, "n": 1}
    return {
      "main_metric": "accuracy",
      "dev": {"accuracy": s},
      "test": {},
      "recipe": {"lr": c.opt.lr},
    }

  monkeypatch.setattr(ft_grid, "run_point", fake_run_point)
  c = finetune_config.get_config("custom,grid=True")
  res = finetune.finetune(c, str(tmp_path))
  assert len(seen) == 18 and len({s[3] for s in seen}) == 18
  assert res["recipe"] == {"lr": 3e-5} and len(res["grid"]) == 18
  assert json.load(open(tmp_path / "results.json"))["recipe"] == {"lr": 3e-5}
