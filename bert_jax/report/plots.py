"""The plots: loss curves of the pretraining runs; per-task bars (std error bars) and score vs
model size of the fine-tuning points. They need matplotlib (`pip install 'bert_jax[plots]'`)."""

from __future__ import annotations

import os
from typing import Any

from bert_jax.report.runs import FinetuneRun, Run
from bert_jax.report.tables import finetune_points, param_count, pooled, train_loss


def _pyplot() -> Any:
  """matplotlib.pyplot on the Agg backend; ImportError naming the extra when it is missing."""
  try:
    import matplotlib
  except ImportError:
    raise ImportError("plots need matplotlib: pip install 'bert_jax[plots]'") from None

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _save(plt: Any, fig: Any, path: str) -> str:
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=100, bbox_inches="tight")
  plt.close(fig)
  os.replace(tmp, path)
  return path


def plot(runs: list[Run], out_dir: str) -> list[str]:
  """Train loss, train LM loss and (if any) eval LM loss per step, one line per run.

  Raises ImportError naming the extra when matplotlib is not installed."""
  plt = _pyplot()
  written = []
  lm_loss = lambda row: row.get("mlm_loss", row.get("ltr_loss"))
  for split, fname, title, value in (
    ("train", "train_loss", "train loss (LM + NSP)", train_loss),
    # Without the NSP term: comparable between runs with and without NSP.
    ("train", "train_lm_loss", "train LM loss (MLM or LTR)", lm_loss),
    ("eval", "eval_loss", "eval LM loss", lm_loss),
  ):
    series = []
    for r in runs:
      pts = [(row["step"], value(row)) for row in r.rows.get(split, [])]
      pts = [(s, v) for s, v in pts if v is not None]
      if pts:
        series.append((r.name, pts))
    if not series:
      continue
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in series:
      ax.plot(*zip(*pts, strict=True), marker="o" if len(pts) < 20 else None, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(plt, fig, os.path.join(out_dir, f"{fname}.png")))
  return written


def _size_axis(ax: Any, millions: list[float]) -> None:
  """Log x axis ticked at the points' own sizes (plain numbers, not powers of ten)."""
  ax.set_xscale("log")
  ax.set_xticks(millions, [f"{m:.3g}" for m in millions])
  ax.minorticks_off()
  ax.set_xlabel("parameters (millions, BertModel: embeddings + layers + pooler)")


def plot_finetune(
  runs: list[Run], ft_runs: list[FinetuneRun], out_dir: str, split: str = "test"
) -> list[str]:
  """finetune_tasks.png: per task, one bar per point with the seeds' std as error bar;
  finetune_vs_size.png (points of different sizes): score and MLM perplexity vs parameters."""
  plt = _pyplot()
  columns, points = finetune_points(runs, ft_runs, split)
  points = pooled(points)  # a bar per compared point: its pretraining runs pooled
  columns = [c for c in columns if any(c.task in p.cells for p in points)]
  written = []
  if not columns:  # no run has this split's numbers yet
    return written
  fig, axes = plt.subplots(
    1, len(columns), figsize=(max(4.5, 0.9 * len(points) + 1.5) * len(columns), 4.5)
  )
  for ax, col in zip(list(getattr(axes, "flat", [axes])), columns, strict=True):
    have = [p for p in points if col.task in p.cells]
    x = range(len(have))
    ax.bar(
      x,
      [p.cells[col.task]["mean"] for p in have],
      yerr=[p.cells[col.task]["std"] for p in have],
      capsize=4,
      color="tab:blue",
      alpha=0.8,
    )
    ax.set_xticks(list(x), [p.name for p in have], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{col.metric} (%), mean ± sd over pretraining runs")
    ax.grid(axis="y", alpha=0.3)
    # Zoom on the spread: the differences between points, against the seeds' std, are what
    # the figure is for; the title says when the axis does not start at 0.
    lo = min(p.cells[col.task]["mean"] - p.cells[col.task]["std"] for p in have)
    hi = max(p.cells[col.task]["mean"] + p.cells[col.task]["std"] for p in have)
    pad = max(1.0, 0.15 * (hi - lo))
    bottom = max(0.0, lo - pad) if lo >= 0 else lo - pad
    ax.set_ylim(bottom, hi + pad)
    zoomed = f"\n(y axis zoomed: starts at {bottom:.1f})" if bottom > 0 else ""
    ax.set_title(col.header + zoomed, fontsize=10)
  seeds = sorted({p.cells[c.task]["n"] for c in columns for p in points if c.task in p.cells})
  runs_ = "/".join(map(str, seeds))
  fig.suptitle(f"fine-tuning, {split} split ({runs_} pretraining runs, fine-tuning seeds nested)")
  fig.tight_layout()
  written.append(_save(plt, fig, os.path.join(out_dir, "finetune_tasks.png")))

  sized = [(param_count(p.config), p) for p in points]
  sized = sorted(((n, p) for n, p in sized if n is not None), key=lambda t: t[0])
  if len({n for n, _ in sized}) > 1:
    with_ppl = [
      (n, p) for n, p in sized if p.pretrain and "mlm_perplexity" in p.pretrain.last("eval")
    ]
    fig, axes = plt.subplots(1, 2 if with_ppl else 1, figsize=(12 if with_ppl else 7, 4.5))
    ax = axes[0] if with_ppl else axes
    for col in columns:
      pts = [(n / 1e6, p.cells[col.task]) for n, p in sized if col.task in p.cells]
      if pts:
        ax.errorbar(
          [m for m, _ in pts],
          [c["mean"] for _, c in pts],
          yerr=[c["std"] for _, c in pts],
          marker="o",
          capsize=4,
          label=f"{col.header}",
        )
    _size_axis(ax, [n / 1e6 for n, _ in sized])
    ax.set_ylabel("score (%), mean ± sd over pretraining runs")
    ax.set_title(f"fine-tuning score vs model size ({split})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if with_ppl:
      ax = axes[1]
      xs = [n / 1e6 for n, _ in with_ppl]
      ax.plot(xs, [p.pretrain.last("eval")["mlm_perplexity"] for _, p in with_ppl], marker="o")
      for x, (_, p) in zip(xs, with_ppl, strict=True):
        y = p.pretrain.last("eval")["mlm_perplexity"]
        ax.annotate(p.name, (x, y), xytext=(5, 5), textcoords="offset points", fontsize=7)
      _size_axis(ax, xs)
      ax.set_ylabel("held-out MLM perplexity")
      ax.set_title("MLM perplexity vs model size")
      ax.grid(alpha=0.3)
    fig.tight_layout()
    written.append(_save(plt, fig, os.path.join(out_dir, "finetune_vs_size.png")))
  return written
