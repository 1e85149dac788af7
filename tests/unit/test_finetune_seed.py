"""bert_jax.finetune.seed: a seed's schedule (epochs raised to opt.min_steps, dev evaluations) and
its optimizer config."""

import pytest

from bert_jax.finetune import seed as ft_seed
from unit._finetune_tasks import finetune_config


@pytest.mark.parametrize(
  "rows, batch, epochs, min_steps, want",
  [
    (60, 32, 3, 100, (2, 50, 34)),  # 46's small set: 6 steps -> 100, dev every 17 epochs
    (60, 8, 10, 100, (8, 13, 16)),  # 80 steps -> 104
    (2000, 32, 2, 100, (63, 2, 63)),  # the paper's recipe on 2,000 rows: unchanged
    (60, 32, 3, 0, (2, 3, 2)),  # min_steps=0: opt.epochs
  ],
)
def test_a_small_training_set_trains_at_least_min_steps(rows, batch, epochs, min_steps, want):
  """46, first hour 1: epochs are raised until a seed takes opt.min_steps steps (default 100);
  dev is then evaluated as many times as opt.epochs asked for."""
  c = finetune_config.get_config("custom")
  assert c.opt.min_steps == 100 and (c.opt.lr, c.data.batch_size, c.opt.epochs) == (3e-5, 32, 3)
  c.data.batch_size, c.opt.epochs, c.opt.min_steps = batch, epochs, min_steps
  plan = ft_seed.schedule(c, rows)
  assert (plan.per_epoch, plan.epochs, plan.eval_every) == want
  assert plan.total_steps == want[0] * want[1] >= min(min_steps, want[0] * want[1])
  opt = ft_seed.optimizer_config(c, plan.per_epoch, plan.epochs)
  assert (opt.total_steps, opt.warmup_steps) == (plan.total_steps, round(0.1 * plan.total_steps))
