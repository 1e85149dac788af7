"""The tables: pretraining runs (one row per run, the ablated config fields and the last
metrics) and fine-tuning in the paper's layout (one row per pretraining point, one column per
task: the main metric's mean ± std over seeds x 100), as markdown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bert_jax.report import published
from bert_jax.report.runs import FinetuneRun, Run

REF = "mlm_reference_accuracy"  # bert_jax/ngram_reference.py's, in a final eval row
# Config fields that differ between runs without being an ablation (a pretraining seed's own:
# config_lib.pretraining_seed).
_IGNORED_FIELDS = ("data.dir", "init_from", "seed", "data.seed")


def _used(config: dict[str, Any], key: str) -> Any:
  """A config field's value as training used it: a run that reads built data (data.dir) never
  reads its raw corpus (data.input, a default that moves with the checkout)."""
  if key == "data.input" and config.get("data.dir"):
    return None
  return config.get(key)


def ablated_fields(runs: list[Run]) -> list[str]:
  """Config fields whose values differ between the runs, in config order."""
  keys: list[str] = []
  for r in runs:
    keys += [k for k in r.config if k not in keys]
  return [
    k
    for k in keys
    if k not in _IGNORED_FIELDS and len({repr(_used(r.config, k)) for r in runs}) > 1
  ]


def train_loss(row: dict[str, float]) -> float | None:
  """The objective's loss as train.py prints it: LM (MLM or LTR) loss + NSP loss."""
  if "loss" in row:
    return row["loss"]
  lm = row.get("mlm_loss", row.get("ltr_loss"))
  if lm is None:
    return None
  return lm + row.get("nsp_loss", 0.0)


COLUMNS = (
  ("steps", None),
  ("tokens (M)", None),
  ("train loss", None),
  ("eval MLM acc", "mlm_accuracy"),
  # The count-based reference on the same held-out targets (bert_jax/ngram_reference.py) and
  # always predicting the most frequent target: what an MLM that learned must beat.
  ("MLM reference acc", "mlm_reference_accuracy"),
  ("MLM majority acc", "mlm_majority_baseline"),
  ("eval MLM ppl", "mlm_perplexity"),
  ("eval LTR acc", "ltr_accuracy"),
  ("LTR reference acc", "ltr_reference_accuracy"),
  ("eval LTR ppl", "ltr_perplexity"),
  ("eval NSP acc", "nsp_accuracy"),
)


def tokens_seen(run: Run) -> int | None:
  """Pretraining tokens: steps x batch x sequence length (padding included), or None."""
  batch, length = run.config.get("data.batch_size"), run.config.get("data.max_seq_length")
  if not batch or not length or not run.steps():
    return None
  return run.steps() * int(batch) * int(length)


def table(runs: list[Run]) -> tuple[list[str], list[list[Any]]]:
  """(header, rows) with raw values (None where a run has no such metric)."""
  fields = ablated_fields(runs)
  header = ["run", *fields, *(c for c, _ in COLUMNS)]
  rows = []
  for r in runs:
    ev = r.last("eval")
    tokens = tokens_seen(r)
    row = [r.name, *(r.config.get(k) for k in fields), r.steps()]
    row += [None if tokens is None else f"{tokens / 1e6:.1f}", train_loss(r.last("train"))]
    row += [ev.get(key) for _, key in COLUMNS[3:]]
    rows.append(row)
  return header, rows


def learned_lines(runs: list[Run]) -> list[str]:
  """A line per LM objective: which runs' last held-out accuracy beats the count-based
  reference and the majority baseline on the same targets."""
  lines = []
  for lm in ("mlm", "ltr"):
    have = [(r, r.last("eval")) for r in runs if f"{lm}_accuracy" in r.last("eval")]
    judged = [(r, ev) for r, ev in have if f"{lm}_reference_accuracy" in ev]
    if not judged:
      continue
    above = [r.name for r, ev in judged if ev[f"{lm}_accuracy"] > ev[f"{lm}_reference_accuracy"]]
    below = [r.name for r, ev in judged if r.name not in above]
    line = (
      f"held-out {lm.upper()} accuracy above the count-based reference on the same targets: "
      f"{len(above)} of {len(judged)} runs"
    )
    line += f" (not: {', '.join(below)})" if below else ""
    base = [(r, ev) for r, ev in have if f"{lm}_majority_baseline" in ev]
    if base:
      beat = sum(ev[f"{lm}_accuracy"] > ev[f"{lm}_majority_baseline"] for _, ev in base)
      line += f"; above the majority baseline: {beat} of {len(base)}"
    if len(judged) < len(have):
      line += f"; {len(have) - len(judged)} without a reference"
    lines.append(line)
  return lines


def _cell(v: Any) -> str:
  if v is None:
    return "–"
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, float):
    return "nan" if math.isnan(v) else f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}"
  return str(v)


def markdown(header: list[str], rows: list[list[Any]]) -> str:
  # Drop metric columns no run has (e.g. LTR columns in a masking sweep).
  keep = [i for i in range(len(header)) if any(r[i] is not None for r in rows) or i == 0]
  lines = ["| " + " | ".join(header[i] for i in keep) + " |"]
  lines.append("|" + "|".join("---" for _ in keep) + "|")
  lines += ["| " + " | ".join(_cell(r[i]) for i in keep) + " |" for r in rows]
  return "\n".join(lines)


def _task_order(tasks: set[str]) -> list[str]:
  rank = lambda t: (
    published.ORDER.index(published.COLUMNS[t]) if t in published.COLUMNS else len(published.ORDER),
    t,
  )
  return sorted(tasks, key=rank)


def param_count(config: dict[str, Any]) -> int | None:
  """BertModel's parameter count (embeddings, layers, pooler) from a flattened config; None
  when the config lacks a size field. BERT-Base: 109,482,240."""
  try:
    v, h, layers, i = (
      int(config[f"model.{k}"])
      for k in ("vocab_size", "hidden_size", "num_layers", "intermediate_size")
    )
  except KeyError:
    return None
  p = int(config.get("model.max_position_embeddings", 512))
  t = int(config.get("model.type_vocab_size", 2))
  embeddings = (v + p + t) * h + 2 * h
  layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
  return embeddings + layers * layer + (h * h + h)


@dataclass
class Column:
  task: str
  metric: str
  scale: float  # 100 for fractions, 1 for metrics already in percent (official SQuAD)

  @property
  def header(self) -> str:
    paper = published.COLUMNS.get(self.task)
    return f"{self.task} ({paper}) {self.metric}" if paper else f"{self.task} {self.metric}"


@dataclass
class Point:
  name: str
  config: dict[str, Any]
  pretrain: Run | None
  cells: dict[str, dict[str, float]]  # task -> summary (mean, std, n), already x scale


def finetune_points(
  runs: list[Run], ft_runs: list[FinetuneRun], split: str = "test"
) -> tuple[list[Column], list[Point]]:
  """The columns (tasks) and rows (points) of the fine-tuning table, values x 100."""
  by_name = {r.name: r for r in runs}
  tasks = _task_order({f.task for f in ft_runs})
  columns = []
  for task in tasks:
    of_task = [f for f in ft_runs if f.task == task]
    metrics_ = sorted({f.results["main_metric"] for f in of_task})
    if len(metrics_) > 1:
      raise ValueError(f"task {task}: runs disagree on the main metric ({', '.join(metrics_)})")
    # Fractions are shown x 100 as in the paper; a task whose values exceed 1 (the official
    # SQuAD script's percentages) is already in percent.
    values = [
      abs(v)
      for f in of_task
      for s in [f.summary(split)]
      if s
      for v in (s["mean"], s.get("min", 0.0), s.get("max", 0.0))
    ]
    percent = of_task[0].results.get("kind") == "span_qa" or any(v > 1 for v in values)
    columns.append(Column(task, metrics_[0], 1.0 if percent else 100.0))
  points: dict[str, Point] = {}
  for f in ft_runs:
    pre = by_name.get(f.point)
    pt = points.setdefault(f.point, Point(f.point, pre.config if pre else {}, pre, {}))
    s = f.summary(split)
    if s is not None:
      col = next(c for c in columns if c.task == f.task)
      pt.cells[f.task] = {
        "mean": s["mean"] * col.scale,
        "std": s.get("std", 0.0) * col.scale,
        "n": int(s.get("n", 1)),
      }
  rows = list(points.values())
  sizes = [param_count(p.config) for p in rows]
  if len({s for s in sizes if s is not None}) > 1:  # a size sweep: smallest first, as Table 6
    rows.sort(key=lambda p: (param_count(p.config) or 0, p.name))
  else:
    rows.sort(key=lambda p: p.name)
  return columns, rows


SEED = "seed"  # the point key of a pretraining seed (experiments: config_lib.pretraining_seed)


def split_seed(name: str) -> tuple[str, int | None]:
  """'task=mlm,seed=2' -> ('task=mlm', 2); a name without a seed -> (name, None)."""
  rest, seed = [], None
  for item in name.split(","):
    key, _, value = item.partition("=")
    if key == SEED and value.isdigit():
      seed = int(value)
    else:
      rest.append(item)
  return ",".join(rest) or name, seed


@dataclass
class Arm:
  """A compared point: its pretraining runs (one Point per pretraining seed)."""

  name: str
  points: list[Point]

  @property
  def config(self) -> dict[str, Any]:
    return self.points[0].config

  def values(self, task: str) -> list[float]:
    """Per pretraining seed: the mean of its fine-tuning seeds on `task`."""
    return [p.cells[task]["mean"] for p in self.points if task in p.cells]

  def finetune_seeds(self, task: str) -> list[int]:
    return [p.cells[task]["n"] for p in self.points if task in p.cells]

  def lm(self, metric: str) -> list[float]:
    """Per pretraining seed: the last held-out eval's `metric`."""
    return [
      p.pretrain.last("eval")[metric]
      for p in self.points
      if p.pretrain and metric in p.pretrain.last("eval")
    ]


def arms(points: list[Point]) -> list[Arm]:
  """The points grouped by everything but their pretraining seed, in the points' order."""
  out: dict[str, Arm] = {}
  for p in points:
    name, _ = split_seed(p.name)
    out.setdefault(name, Arm(name, [])).points.append(p)
  return list(out.values())


def pooled(points: list[Point]) -> list[Point]:
  """One Point per compared point (arms): each task's cell the mean and sd over pretraining
  seeds of their fine-tuning seeds' means, n the pretraining runs; pretrain its first run."""
  out = []
  for a in arms(points):
    cells = {}
    for task in {t for p in a.points for t in p.cells}:
      mean, sd = mean_sd(a.values(task))
      cells[task] = {"mean": mean, "std": sd, "n": len(a.values(task))}
    out.append(Point(a.name, a.config, a.points[0].pretrain, cells))
  return out


def mean_sd(values: list[float]) -> tuple[float, float]:
  n = len(values)
  mean = sum(values) / n
  sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
  return mean, sd


def arm_cell(arm: Arm, task: str) -> str | None:
  """'84.1 ± 0.3 (3 x 2)': the mean and sd over pretraining seeds of their fine-tuning seeds'
  means, with the number of pretraining runs x fine-tuning seeds each."""
  values = arm.values(task)
  if not values:
    return None
  mean, sd = mean_sd(values)
  ft = sorted(set(arm.finetune_seeds(task)))
  return f"{mean:.1f} ± {sd:.1f} ({len(values)} x {'/'.join(map(str, ft))})"


def _lm_cell(values: list[float], scale: float, digits: int) -> str | None:
  if not values:
    return None
  mean, sd = mean_sd([v * scale for v in values])
  return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if len(values) > 1 else "")


def finetune_table(
  runs: list[Run],
  ft_runs: list[FinetuneRun],
  split: str = "test",
  paper: str | None = None,
  baselines: dict[str, dict[str, float]] | None = None,
) -> tuple[list[str], list[list[Any]]]:
  """(header, rows) of the paper-layout table, one row per compared point (its pretraining
  seeds pooled): cells are strings ("84.1 ± 0.3 (3 x 2)") or None; then a row per trivial
  baseline (`baselines`: {task: {name: value}}) and the paper's rows."""
  columns, points = finetune_points(runs, ft_runs, split)
  groups = arms(points)
  fields = ablated_fields([p.pretrain for p in points if p.pretrain])
  if paper and paper not in published.TABLES:
    raise ValueError(f"--paper={paper}: one of {', '.join(published.TABLES)}")
  paper_rows = published.TABLES[paper] if paper else []
  ours = {published.COLUMNS.get(c.task) for c in columns}
  # Paper columns none of our tasks stands for still get a column, so no number is lost.
  extra = [k for k in published.ORDER if k not in ours and any(k in v for _, _, v in paper_rows)]
  # The count-based reference beside the accuracy, where the points have one.
  with_ref = any(p.pretrain and REF in p.pretrain.last("eval") for p in points)
  header = ["point", *fields, "MLM ppl", "MLM acc %", *(["MLM ref %"] if with_ref else [])]
  header += [c.header for c in columns]
  header += [f"{k} (paper only)" for k in extra]
  rows = []
  for a in groups:
    rows.append(
      [
        a.name,
        *(a.config.get(k) for k in fields),
        _lm_cell(a.lm("mlm_perplexity"), 1, 2),
        _lm_cell(a.lm("mlm_accuracy"), 100, 1),
        *([_lm_cell(a.lm(REF), 100, 1)] if with_ref else []),
        *(arm_cell(a, c.task) for c in columns),
        *(None for _ in extra),
      ]
    )
  names = sorted({n for b in (baselines or {}).values() for n in b})
  for name in names:
    cells = [(baselines or {}).get(c.task, {}).get(name) for c in columns]
    rows.append(
      [
        f"baseline: {name}",
        *(None for _ in fields),
        None,
        None,
        *([None] if with_ref else []),
        *(None if v is None else f"{v:.1f}" for v in cells),
        *(None for _ in extra),
      ]
    )
  for label, config, values in paper_rows:
    lm = values.get(published.LM_PPL)
    rows.append(
      [
        f"paper: {label}",
        *(config.get(k) for k in fields),
        None if lm is None else f"{lm:.2f}",
        None,
        *([None] if with_ref else []),
        *(_fmt_paper(values.get(published.COLUMNS.get(c.task, ""))) for c in columns),
        *(_fmt_paper(values.get(k)) for k in extra),
      ]
    )
  return header, rows


def _fmt_paper(v: float | None) -> str | None:
  return None if v is None else f"{v:.1f}"
