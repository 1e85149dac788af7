r"""Paper-style results tables and plots for a directory of runs (e.g. a sweep's --root).

  python -m bert_jax.report --root=/tmp/table5 [--paper=table5|table6|masking|wwm] \
      [--split=test|dev]

Pretraining: every directory under --root holding a `metrics.jsonl` (written by train.py) is a
run; its `config.json` says what it was. The table has one row per run: the config fields
that differ between the runs (the ablated ones), the steps trained, the final train loss (LM
loss + NSP loss, as the trainer prints it), and the last eval's MLM/LTR accuracy and
perplexity and NSP accuracy.

Fine-tuning: every `results.json` (written by bert_jax.finetune) is a fine-tuning run, laid
out as `<root>/<point>/finetune/<task>/results.json` (a sweep: <point> is the pretraining
run's workdir) or given directly (--root = a fine-tuning workdir, or a directory of them: the
point is then the checkpoint the run started from, its `init`). The table is the paper's
layout: one row per pretraining point (its ablated fields, its held-out MLM perplexity and
accuracy), one column per task with the main metric's "mean ± std (n seeds)" x 100 on --split,
and their average. `--paper` adds published rows under ours (Devlin et al. 2019's Table 5 or
6; RoBERTa's static/dynamic masking; the BERT repository's whole-word masking) and a line per
claim judged against the seed spread; PAPER_COLUMNS says which paper column each of our
stand-in tasks fills.

The tables are printed as markdown and written, with plots (loss curves; per-task bars with
std error bars; score vs model size when the points differ in size), to --root/report/. The
plots need matplotlib (`pip install 'bert_jax[plots]'`); without it the tables are still
written and the command says the plots were skipped.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from absl import flags

from bert_jax import cli

REPORT_DIR = "report"
# Config fields that differ between runs without being an ablation.
_IGNORED_FIELDS = ("data.dir", "init_from")


@dataclass
class Run:
  name: str  # path relative to the root
  config: dict[str, Any]  # flattened: {"objective.nsp": True, ...}
  rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # split -> rows

  def last(self, split: str) -> dict[str, float]:
    return self.rows.get(split, [{}])[-1]

  def steps(self) -> int:
    return max((int(r["step"]) for rs in self.rows.values() for r in rs), default=0)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
  return out


def read_metrics(path: str) -> dict[str, list[dict[str, float]]]:
  """metrics.jsonl -> {split: rows sorted by step}; a bad line is an error naming it."""
  rows: dict[str, list[dict[str, float]]] = {}
  with open(path) as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        split, step = row["split"], int(row["step"])
      except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}:{i}: not a metrics row (JSON with step and split)") from None
      rows.setdefault(split, []).append({**row, "step": step})
  for rs in rows.values():
    rs.sort(key=lambda r: r["step"])
  return rows


_SKIPPED_DIRS = (REPORT_DIR, "checkpoints", "tb", "data")
# A fine-tuning tree: <point>/finetune/..., a run's seed_<k>/ (each with its own metrics.jsonl).
_FINETUNE_DIR = "finetune"
FINETUNE_RESULTS = "results.json"
_SEED_DIR = re.compile(r"seed_\d+")


def _check_root(root: str) -> None:
  if not os.path.isdir(root):
    raise FileNotFoundError(f"--root={root}: no such directory")


def find_runs(root: str, required: bool = True) -> list[Run]:
  """Pretraining runs below root (fine-tuning trees excluded); with `required`, none is an
  error."""
  _check_root(root)
  runs = []
  for d, dirs, files in os.walk(root, followlinks=True):
    if FINETUNE_RESULTS in files:  # a fine-tuning workdir: its seeds are not pretraining runs
      dirs[:] = []
      continue
    dirs[:] = sorted(
      x for x in dirs if x not in (*_SKIPPED_DIRS, _FINETUNE_DIR) and not _SEED_DIR.fullmatch(x)
    )
    if "metrics.jsonl" not in files:
      continue
    config = {}
    path = os.path.join(d, "config.json")
    if os.path.isfile(path):
      with open(path) as f:
        try:
          config = json.load(f)
        except ValueError:
          raise ValueError(f"{path}: not valid JSON") from None
      if not isinstance(config, dict):
        raise ValueError(f"{path}: not a run's config (not a JSON object)")
      config = flatten(config)
    name = os.path.relpath(d, root)
    runs.append(Run(name, config, read_metrics(os.path.join(d, "metrics.jsonl"))))
  if not runs and required:
    raise ValueError(f"--root={root}: no run (a directory with metrics.jsonl) below it")
  return runs


def ablated_fields(runs: list[Run]) -> list[str]:
  """Config fields whose values differ between the runs, in config order."""
  keys: list[str] = []
  for r in runs:
    keys += [k for k in r.config if k not in keys]
  return [
    k for k in keys if k not in _IGNORED_FIELDS and len({repr(r.config.get(k)) for r in runs}) > 1
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
  ("train loss", None),
  ("eval MLM acc", "mlm_accuracy"),
  ("eval MLM ppl", "mlm_perplexity"),
  ("eval LTR acc", "ltr_accuracy"),
  ("eval LTR ppl", "ltr_perplexity"),
  ("eval NSP acc", "nsp_accuracy"),
)


def table(runs: list[Run]) -> tuple[list[str], list[list[Any]]]:
  """(header, rows) with raw values (None where a run has no such metric)."""
  fields = ablated_fields(runs)
  header = ["run", *fields, *(c for c, _ in COLUMNS)]
  rows = []
  for r in runs:
    ev = r.last("eval")
    row = [r.name, *(r.config.get(k) for k in fields), r.steps(), train_loss(r.last("train"))]
    row += [ev.get(key) for _, key in COLUMNS[2:]]
    rows.append(row)
  return header, rows


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


# ---------------------------------------------------------------------------------------------
# Fine-tuning runs (results.json) in the paper's table layout.

# Our stand-in tasks (issue #21's downstream suite) and GLUE/SQuAD presets -> the paper's
# column each stands for.
PAPER_COLUMNS = {
  "rotten_tomatoes": "SST-2",
  "sst2": "SST-2",
  "vitaminc": "MNLI-m",
  "mnli": "MNLI-m",
  "squadshifts": "SQuAD",
  "squad": "SQuAD",
  "qnli": "QNLI",
  "mrpc": "MRPC",
}
_PAPER_ORDER = ("MNLI-m", "QNLI", "MRPC", "SST-2", "SQuAD")
_LM_PPL = "LM ppl"
_SIZE_FIELDS = ("model.num_layers", "model.hidden_size", "model.num_heads")
# Devlin et al. (2019), dev sets: (row label, config fields it sets, {column: value}).
# Table 5 (BERT-Base architecture): accuracies, SQuAD v1.1 F1.
# Table 6: held-out masked-LM perplexity and accuracies of 5 fine-tuning restarts (mean).
PAPER_TABLES: dict[str, list[tuple[str, dict[str, int], dict[str, float]]]] = {
  "table5": [
    ("BERT-Base", {}, {"MNLI-m": 84.4, "QNLI": 88.4, "MRPC": 86.7, "SST-2": 92.7, "SQuAD": 88.5}),
    ("No NSP", {}, {"MNLI-m": 83.9, "QNLI": 84.9, "MRPC": 86.5, "SST-2": 92.6, "SQuAD": 87.9}),
    (
      "LTR & No NSP",
      {},
      {"MNLI-m": 82.1, "QNLI": 84.3, "MRPC": 77.5, "SST-2": 92.1, "SQuAD": 77.8},
    ),
    ("+ BiLSTM", {}, {"MNLI-m": 82.1, "QNLI": 84.1, "MRPC": 75.7, "SST-2": 91.6, "SQuAD": 84.9}),
  ],
  "table6": [
    (
      f"L={layers} H={hidden} A={heads}",
      dict(zip(_SIZE_FIELDS, (layers, hidden, heads), strict=True)),
      v,
    )
    for layers, hidden, heads, v in (
      (3, 768, 12, {_LM_PPL: 5.84, "MNLI-m": 77.9, "MRPC": 79.8, "SST-2": 88.4}),
      (6, 768, 3, {_LM_PPL: 5.24, "MNLI-m": 80.6, "MRPC": 82.2, "SST-2": 90.7}),
      (6, 768, 12, {_LM_PPL: 4.68, "MNLI-m": 81.9, "MRPC": 84.8, "SST-2": 91.3}),
      (12, 768, 12, {_LM_PPL: 3.99, "MNLI-m": 84.4, "MRPC": 86.7, "SST-2": 92.9}),
      (12, 1024, 16, {_LM_PPL: 3.54, "MNLI-m": 85.7, "MRPC": 86.9, "SST-2": 93.3}),
      (24, 1024, 16, {_LM_PPL: 3.23, "MNLI-m": 86.6, "MRPC": 87.8, "SST-2": 93.7}),
    )
  ],
  # Not Devlin et al.: RoBERTa (Liu et al. 2019) Table 1, BERT-Base size, dev: SQuAD 2.0 F1,
  # MNLI-m, SST-2 accuracy.
  "masking": [
    ("static (RoBERTa Table 1; SQuAD 2.0)", {}, {"SQuAD": 78.3, "MNLI-m": 84.3, "SST-2": 92.5}),
    ("dynamic (RoBERTa Table 1; SQuAD 2.0)", {}, {"SQuAD": 78.7, "MNLI-m": 84.0, "SST-2": 92.9}),
  ],
  # The BERT repository's README (2019-05-31 whole-word release), BERT-Large uncased, dev:
  # SQuAD 1.1 F1, MultiNLI accuracy.
  "wwm": [
    ("BERT-Large (BERT README)", {}, {"SQuAD": 91.0, "MNLI-m": 86.05}),
    ("+ whole-word masking (BERT README)", {}, {"SQuAD": 92.8, "MNLI-m": 87.07}),
  ],
}
# What each --paper table is, for the table's title.
PAPER_SOURCES = {
  "table5": "Devlin et al. 2019 Table 5, dev sets",
  "table6": "Devlin et al. 2019 Table 6, dev sets",
  "masking": "Liu et al. 2019 (RoBERTa) Table 1, dev sets",
  "wwm": "the BERT repository's whole-word masking table, BERT-Large, dev sets",
}


@dataclass
class FinetuneRun:
  point: str  # the pretraining point: the path before /finetune/, else the run's init
  task: str
  path: str  # its results.json
  results: dict[str, Any]
  # Other results.json of the same point and task (an unfinished grid: no top-level file
  # yet); this run is the best of them on dev, as the grid's own choice would be.
  others: list[str] = field(default_factory=list)

  def summary(self, split: str) -> dict[str, float] | None:
    """{mean, std, n, ...} of the main metric on `split`, or None when the run has none."""
    metric = self.results["main_metric"]
    s = self.results.get(split, {}).get(metric)
    if s is not None:
      return s
    values = [r[split][metric] for r in self.results.get("seeds", []) if metric in r.get(split, {})]
    if not values:
      return None
    from bert_jax.tasks import metrics  # only for results.json files without the summary

    return metrics.summarize(values)


def find_finetune_runs(root: str) -> list[FinetuneRun]:
  """Every results.json below root (a grid's top-level one stands for its points)."""
  _check_root(root)
  runs = []
  for d, dirs, files in os.walk(root, followlinks=True):
    dirs[:] = sorted(x for x in dirs if x not in _SKIPPED_DIRS and not _SEED_DIR.fullmatch(x))
    if FINETUNE_RESULTS not in files:
      continue
    dirs[:] = []
    path = os.path.join(d, FINETUNE_RESULTS)
    with open(path) as f:
      try:
        results = json.load(f)
      except ValueError:
        raise ValueError(f"{path}: not valid JSON") from None
    if not isinstance(results, dict) or not {"task", "main_metric"} <= set(results):
      raise ValueError(f"{path}: not a fine-tuning results.json (no task or main_metric)")
    parts = os.path.relpath(d, root).split(os.sep)
    if _FINETUNE_DIR in parts:
      i = len(parts) - 1 - parts[::-1].index(_FINETUNE_DIR)
      point = os.path.join(*parts[:i]) if i else "."
    else:
      point = str(results.get("init") or os.path.relpath(d, root))
    runs.append(FinetuneRun(point, str(results["task"]), path, results))
  return _best_on_dev(runs)


def _best_on_dev(runs: list[FinetuneRun]) -> list[FinetuneRun]:
  """One run per (point, task): the best mean dev main metric; the rest go to `others`."""
  groups: dict[tuple[str, str], list[FinetuneRun]] = {}
  for r in runs:
    groups.setdefault((r.point, r.task), []).append(r)
  out = []
  for group in groups.values():
    dev = lambda r: (r.summary("dev") or {"mean": -math.inf})["mean"]
    best = max(group, key=dev)  # first of equals: walk order, deterministic
    best.others = [r.path for r in group if r is not best]
    out.append(best)
  return out


def _task_order(tasks: set[str]) -> list[str]:
  rank = lambda t: (
    _PAPER_ORDER.index(PAPER_COLUMNS[t]) if t in PAPER_COLUMNS else len(_PAPER_ORDER),
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
    paper = PAPER_COLUMNS.get(self.task)
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


def _stat_cell(c: dict[str, float] | None) -> str | None:
  return None if c is None else f"{c['mean']:.1f} ± {c['std']:.1f} ({c['n']})"


def finetune_table(
  runs: list[Run], ft_runs: list[FinetuneRun], split: str = "test", paper: str | None = None
) -> tuple[list[str], list[list[Any]]]:
  """(header, rows) of the paper-layout table: cells are strings ("84.1 ± 0.3 (5)") or None."""
  columns, points = finetune_points(runs, ft_runs, split)
  fields = ablated_fields([p.pretrain for p in points if p.pretrain])
  if paper and paper not in PAPER_TABLES:
    raise ValueError(f"--paper={paper}: one of {', '.join(PAPER_TABLES)}")
  paper_rows = PAPER_TABLES[paper] if paper else []
  ours = {PAPER_COLUMNS.get(c.task) for c in columns}
  # Paper columns none of our tasks stands for still get a column, so no number is lost.
  extra = [k for k in _PAPER_ORDER if k not in ours and any(k in v for _, _, v in paper_rows)]
  header = ["point", *fields, "MLM ppl", "MLM acc %", *(c.header for c in columns)]
  header += [f"{k} (paper only)" for k in extra] + ["average"]
  rows = []
  for p in points:
    ev = p.pretrain.last("eval") if p.pretrain else {}
    ppl, acc = ev.get("mlm_perplexity"), ev.get("mlm_accuracy")
    cells = [p.cells.get(c.task) for c in columns]
    avg = f"{sum(c['mean'] for c in cells) / len(cells):.1f}" if cells and all(cells) else None
    rows.append(
      [
        p.name,
        *(p.config.get(k) for k in fields),
        None if ppl is None else f"{ppl:.2f}",
        None if acc is None else f"{100 * acc:.1f}",
        *(_stat_cell(c) for c in cells),
        *(None for _ in extra),
        avg,
      ]
    )
  for label, config, values in paper_rows:
    lm = values.get(_LM_PPL)
    rows.append(
      [
        f"paper: {label}",
        *(config.get(k) for k in fields),
        None if lm is None else f"{lm:.2f}",
        None,
        *(_fmt_paper(values.get(PAPER_COLUMNS.get(c.task, ""))) for c in columns),
        *(_fmt_paper(values.get(k)) for k in extra),
        None,
      ]
    )
  return header, rows


def _fmt_paper(v: float | None) -> str | None:
  return None if v is None else f"{v:.1f}"


def finetune_markdown(
  runs: list[Run],
  ft_runs: list[FinetuneRun],
  split: str = "test",
  paper: str | None = None,
) -> str:
  md = markdown(*finetune_table(runs, ft_runs, split, paper))
  title = (
    f"## Fine-tuning ({split}; main metric x 100, mean ± std (n seeds); MLM ppl/acc: the "
    "point's last held-out pretraining eval"
  )
  if paper:
    title += f"; paper rows: {PAPER_SOURCES[paper]}"
  notes = [
    f"\n- {r.point} / {r.task}: {len(r.others) + 1} runs, the best on dev shown ({r.path})"
    for r in ft_runs
    if r.others
  ]
  md = f"{title})\n\n{md}" + ("\n" + "".join(notes) if notes else "")
  lines = claims(paper, *finetune_points(runs, ft_runs, split)) if paper else []
  if lines:
    md += (
      f"\n\n### The paper's claims at this scale ({split})\n\nreproduced: the difference "
      "in the claimed direction exceeds the larger seed std of the two; not reproduced: it "
      "exceeds it in the other direction; inconclusive: within the seed spread (or one seed)."
      "\n\n" + "\n".join(f"- {ln}" for ln in lines)
    )
  return md


# ---------------------------------------------------------------------------------------------
# The paper's claims, judged against the seed spread.


def verdict(better: dict[str, float], worse: dict[str, float], comparable: bool = False) -> str:
  """Whether `better` beats `worse` by more than the seed spread (the larger of the stds); with
  `comparable`, whether it is at least as good up to the spread ("comparable or better": not
  reproduced only when worse by more than the spread)."""
  diff = better["mean"] - worse["mean"]
  spread = max(better["std"], worse["std"])
  n = f"n = {better['n']}/{worse['n']}"
  if min(better["n"], worse["n"]) < 2:
    return f"inconclusive: difference {diff:+.1f}, one seed ({n}): no spread to judge it by"
  if comparable:
    word = "not reproduced" if diff < -spread else "reproduced"
  else:
    word = "reproduced" if diff > spread else "not reproduced" if diff < -spread else "inconclusive"
  return f"{word}: difference {diff:+.1f}, seed spread {spread:.1f} ({n})"


def _pairwise(
  columns: list[Column],
  role: dict[Any, Point],
  pairs: tuple[tuple[Any, Any, str], ...],
  judge: Any = verdict,
  only: str | None = None,
) -> list[str]:
  """A claim line per task column (or the `only` paper column) for each (better, worse) pair
  of roles present."""
  lines = []
  for better, worse, text in pairs:
    if better not in role or worse not in role:
      continue
    a, b = role[better], role[worse]
    for c in columns:
      if only and PAPER_COLUMNS.get(c.task) != only:
        continue
      if c.task in a.cells and c.task in b.cells:
        where = f"{c.header} ({a.name} vs {b.name})"
        lines.append(f"{text}, {where}: {judge(a.cells[c.task], b.cells[c.task])}")
  return lines


def _objective(p: Point) -> str | None:
  """Table 5's row of a point, from its pretraining config."""
  mlm, nsp, ltr = (p.config.get(f"objective.{k}") for k in ("mlm", "nsp", "ltr"))
  if ltr and not mlm:
    return "ltr"
  if mlm and not ltr:
    return "mlm_nsp" if nsp else "mlm"
  return None


def claims(paper: str, columns: list[Column], points: list[Point]) -> list[str]:
  """One line per (claim, task): the paper's claim and its verdict on our numbers."""
  lines = []
  if paper == "table5":
    role = {_objective(p): p for p in points if _objective(p)}
    # The "+ BiLSTM" row has no pretraining of its own: found by its name.
    role.update(("ltr_bilstm", p) for p in points if "bilstm" in p.name)
    lines += _pairwise(
      columns,
      role,
      (
        ("mlm", "ltr", "No NSP (MLM) beats LTR & No NSP (the bidirectional LM matters)"),
        ("mlm_nsp", "mlm", "BERT-Base (MLM + NSP) beats No NSP (NSP helps)"),
      ),
    )
    lines += _pairwise(
      columns,
      role,
      (("ltr_bilstm", "ltr", "a BiLSTM on the LTR model improves SQuAD"),),
      only="SQuAD",
    )
  elif paper == "masking":
    role = {p.config.get("masking.mode"): p for p in points}
    text = "dynamic masking is comparable to or better than static"
    judge = functools.partial(verdict, comparable=True)
    lines += _pairwise(columns, role, (("dynamic", "static", text),), judge=judge)
  elif paper == "wwm":
    role = {bool(p.config.get("masking.whole_word")): p for p in points if p.pretrain}
    text = "whole-word masking beats masking WordPieces independently"
    lines += _pairwise(columns, role, ((True, False, text),))
  elif paper == "table6":
    with_size = [(n, p) for p in points if (n := param_count(p.config)) is not None]
    sized = [p for _, p in sorted(with_size, key=lambda t: t[0])]
    if len(sized) < 2:
      return lines
    ppl = [p.pretrain.last("eval").get("mlm_perplexity") if p.pretrain else None for p in sized]
    if all(v is not None for v in ppl):
      falls = all(b < a for a, b in zip(ppl, ppl[1:], strict=False))
      values = (" > " if falls else ", ").join(f"{v:.2f}" for v in ppl)
      lines.append(
        "held-out MLM perplexity falls monotonically with size: "
        + ("reproduced" if falls else "not reproduced")
        + f" ({values}, smallest model first; one pretraining run per size: no seed spread)"
      )
    for c in columns:
      have = [p for p in sized if c.task in p.cells]
      if len(have) < 2:
        continue
      cells = [p.cells[c.task] for p in have]
      # Monotone within the spread: no step down beyond its pair's spread, and the largest
      # model beats the smallest by more than theirs.
      head = verdict(cells[-1], cells[0])
      dips = [
        f"{have[i].name} -> {have[i + 1].name}"
        for i in range(len(cells) - 1)
        if cells[i + 1]["mean"] < cells[i]["mean"] - max(cells[i]["std"], cells[i + 1]["std"])
      ]
      if dips and head.startswith("reproduced"):
        head = "inconclusive" + head[len("reproduced") :]
      means = ", ".join(f"{x['mean']:.1f}" for x in cells)
      extra = f"; drops beyond the spread at {', '.join(dips)}" if dips else ""
      lines.append(
        f"bigger is better on {c.header} (largest vs smallest; means by size {means}{extra}): "
        + head
      )
  return lines


# ---------------------------------------------------------------------------------------------
# Plots


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
    ax.set_ylabel(f"{col.metric} (%), mean ± std over seeds")
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
  fig.suptitle(f"fine-tuning, {split} split ({'/'.join(map(str, seeds))} seeds)")
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
    ax.set_ylabel("score (%), mean ± std over seeds")
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


def report(root: str, paper: str | None = None, split: str = "test") -> tuple[str, str | None]:
  """Writes the tables (root/report/results.md) and the plots; returns the markdown and, when
  the plots were skipped, why."""
  if paper is not None and paper not in PAPER_TABLES:
    raise ValueError(f"--paper={paper}: one of {', '.join(PAPER_TABLES)}")
  if split not in ("test", "dev"):
    raise ValueError(f"--split={split}: test or dev")
  runs = find_runs(root, required=False)
  ft_runs = find_finetune_runs(root)
  if not runs and not ft_runs:
    raise ValueError(
      f"--root={root}: no run (a directory with metrics.jsonl or results.json) below it"
    )
  parts = []
  if runs:
    parts.append(("## Pretraining\n\n" if ft_runs else "") + markdown(*table(runs)))
  if ft_runs:
    parts.append(finetune_markdown(runs, ft_runs, split, paper))
  md = "\n\n".join(parts)
  out_dir = os.path.join(root, REPORT_DIR)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "results.md")
  with open(path + ".tmp", "w") as f:
    f.write(md + "\n")
  os.replace(path + ".tmp", path)
  try:
    if runs:
      plot(runs, out_dir)
    if ft_runs:
      plot_finetune(runs, ft_runs, out_dir, split)
  except ImportError as e:
    return md, str(e)
  return md, None


_ROOT = flags.DEFINE_string("root", None, "Directory holding the runs (e.g. a sweep root).")
_PAPER = flags.DEFINE_enum(
  "paper", None, list(PAPER_TABLES), "Add the paper's published rows of this table."
)
_SPLIT = flags.DEFINE_enum(
  "split",
  "test",
  ["test", "dev"],
  "Fine-tuning split shown (test: measured at the best dev point).",
)
flags.mark_flags_as_required(["root"])


def main(argv: list[str]) -> None:
  del argv
  md, skipped = report(_ROOT.value, _PAPER.value, _SPLIT.value)
  print(md)
  out_dir = os.path.join(_ROOT.value, REPORT_DIR)
  if skipped:
    print(f"\nwritten: {out_dir}/results.md (plots skipped: {skipped})")
  else:
    print(f"\nwritten: {out_dir}/{{results.md,*.png}}")


def run() -> None:
  cli.run(main, "report")


if __name__ == "__main__":
  run()
