"""Paper-style results tables and plots for a directory of runs (e.g. a sweep's --root).

The command line, and what it reads and writes: __main__.py (`python -m bert_jax.report
--help` prints it).

  runs.py       the runs below a root: pretraining (metrics.jsonl) and fine-tuning (results.json)
  tables.py     the pretraining table and the fine-tuning table in the paper's layout
  published.py  the paper's published numbers, as data
  claims.py     the paper's claims as lines of two points' per-pretraining-run values
  stats.py      the test every line goes through (Welch interval, Holm, TOST margin)
  baselines.py  each task's trivial baselines (majority class, tag lookup, overlap sentence)
  verdicts.py   the verdicts across experiments (--verdicts)
  plots.py      loss curves, per-task bars, score vs model size
  __main__.py   the command line
"""

from __future__ import annotations

import json
import os

from bert_jax.report import baselines, claims, plots, published, stats, tables
from bert_jax.report.runs import REPORT_DIR, FinetuneRun, Run, find_finetune_runs, find_runs


def task_baselines(ft_runs: list[FinetuneRun], split: str) -> dict[str, dict[str, float]]:
  """{task: {baseline: value}} from the first run of each task (every point of a report runs
  the same task files)."""
  out: dict[str, dict[str, float]] = {}
  for r in ft_runs:
    if r.task not in out:
      out[r.task] = baselines.task_baselines(r.results, split, r.path)
  return out


def judged_lines(
  runs: list[Run], ft_runs: list[FinetuneRun], split: str, paper: str | None
) -> list[stats.Line]:
  """The report's claim lines, judged (stats.judge: Holm over these lines)."""
  columns, points = tables.finetune_points(runs, ft_runs, split)
  return stats.judge(claims.claim_lines(paper, columns, tables.arms(points)))


def line_markdown(ln: stats.Line) -> str:
  return f"- {ln.text}: {ln.describe()}"


def finetune_markdown(
  runs: list[Run],
  ft_runs: list[FinetuneRun],
  split: str = "test",
  paper: str | None = None,
) -> str:
  base = task_baselines(ft_runs, split)
  md = tables.markdown(*tables.finetune_table(runs, ft_runs, split, paper, base))
  title = (
    f"## Fine-tuning ({split}; main metric x 100, mean ± sd over pretraining runs of each "
    "run's mean over its fine-tuning seeds (pretraining runs x fine-tuning seeds), at the lr "
    "chosen on dev; MLM ppl/acc: the runs' last held-out pretraining eval"
  )
  if paper:
    title += f"; paper rows: {published.SOURCES[paper]}"
  notes = [
    f"\n- {r.point} / {r.task}: {len(r.others) + 1} runs, the best on dev shown ({r.path})"
    for r in ft_runs
    if r.others
  ]
  md = f"{title})\n\n{md}" + ("\n" + "".join(notes) if notes else "")
  lines = judged_lines(runs, ft_runs, split, paper)
  if lines:
    md += (
      f"\n\n### The paper's claims at this scale ({split}; {len(lines)} lines)\n\n"
      f"{stats.TEST}\n\n" + "\n".join(line_markdown(ln) for ln in lines)
    )
  return md


DEADLINE = "deadline.json"  # launch/sweep.py --deadline: the runs it left undone


def add_references(root: str, runs: list[Run]) -> None:
  """Adds the count-based reference (bert_jax/ngram_reference.py) to the last eval row of each
  LM run that finished without one (runs from before the trainer wrote it), where the run's
  data is still there; the others keep none."""
  for r in runs:
    ev = r.last("eval")
    lm = "ltr" if "ltr_accuracy" in ev else "mlm"
    path = os.path.join(root, r.name)
    if f"{lm}_accuracy" not in ev or f"{lm}_reference_accuracy" in ev:
      continue
    data_dir = r.config.get("data.dir") or os.path.join(path, "data")
    if not os.path.isfile(os.path.join(data_dir, "metadata.json")):
      continue
    from bert_jax import cli, ngram_reference  # jax: only for the runs that need it

    print(f"{r.name}: computing the count-based reference (not in its metrics.jsonl)")
    try:
      ev.update(ngram_reference.for_run(path))
    except (OSError, ValueError, KeyError) as e:
      print(f"{r.name}: no count-based reference ({cli.one_line(e)})")


def report(root: str, paper: str | None = None, split: str = "test") -> tuple[str, str | None]:
  """Writes the tables (root/report/results.md) and the plots; returns the markdown and, when
  the plots were skipped, why."""
  if paper is not None and paper not in published.TABLES:
    raise ValueError(f"--paper={paper}: one of {', '.join(published.TABLES)}")
  if split not in ("test", "dev"):
    raise ValueError(f"--split={split}: test or dev")
  runs = find_runs(root, required=False)
  ft_runs = find_finetune_runs(root)
  if not runs and not ft_runs and not os.path.isfile(os.path.join(root, DEADLINE)):
    raise ValueError(
      f"--root={root}: no run (a directory with metrics.jsonl or results.json) below it"
    )
  add_references(root, runs)
  parts = []
  if runs:
    md = ("## Pretraining\n\n" if ft_runs else "") + tables.markdown(*tables.table(runs))
    lines = tables.learned_lines(runs)
    parts.append(md + ("\n\n" + "\n".join(f"- {ln}" for ln in lines) if lines else ""))
  if ft_runs:
    parts.append(finetune_markdown(runs, ft_runs, split, paper))
  if os.path.isfile(os.path.join(root, DEADLINE)):
    with open(os.path.join(root, DEADLINE)) as f:
      not_done = json.load(f).get("not_done", [])
    parts.append(
      f"## Not run: the sweep's deadline came first ({DEADLINE}; rerun the sweep to finish)\n\n"
      + "\n".join(f"- {name}" for name in not_done)
    )
  md = "\n\n".join(parts)
  out_dir = os.path.join(root, REPORT_DIR)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "results.md")
  with open(path + ".tmp", "w") as f:
    f.write(md + "\n")
  os.replace(path + ".tmp", path)
  try:
    if runs:
      plots.plot(runs, out_dir)
    if ft_runs:
      plots.plot_finetune(runs, ft_runs, out_dir, split)
  except ImportError as e:
    return md, str(e)
  return md, None
