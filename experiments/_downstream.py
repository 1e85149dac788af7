"""The downstream suite every experiment fine-tunes its points on.

Not an experiment itself: each experiment file's `finetune_suite(arg)` returns `suite(scale,
data)` (plus its own rows), so every point of every experiment gets the same tasks, recipe,
learning-rate grid and seeds. A run is a dict:

  {"task": "squad_qnli",               # a preset of configs/finetune.py
   "overrides": {"opt.lr": 1e-4, ...}, # --config.KEY=VALUE for bert_jax.finetune, seeds included
   "row": {"task": "ltr_bilstm"}}      # optional: report under this row instead of the point's

launch/sweep.py runs `python -m bert_jax.finetune --config=configs/finetune.py:TASK
--config.init=<root>/<point> --workdir=<root>/<row or point>/finetune/<task> --config.KEY=VALUE`.

Tasks stand in for the paper's columns (bert_jax/report/published.py: COLUMNS): squad_qnli for
QNLI (QNLI's own construction from squadshifts: tools/tasks/make_squad_tasks.py), vitaminc for
MNLI, rotten_tomatoes for SST-2, squad_split for SQuAD (squadshifts with grouped dev and
test), and brown_pos as a token-level task with a lexical baseline (a per-word tag lookup).

Selection is on dev only: each run tries every lr of the grid (`grid.lr`: bert_jax.finetune
keeps the lr with the best mean dev score and reports test there), the no-pretraining control
the same grid. The reduced scales' models are tiny and pretrained for minutes, so their grid is
far above the paper's 2e-5..5e-5 (docs/notes/budget.md section 4).
"""

from __future__ import annotations

import os
from typing import Any

from bert_jax import config_lib

# In the order a point runs them: the tasks most likely to separate at the reduced scales first.
TASKS = ("squad_qnli", "brown_pos", "rotten_tomatoes", "vitaminc", "squad_split")
# tools/replication/build_tasks.sh puts every task's files in DATA/tasks/<task>/ (an
# experiment's data=DIR), built (squad_*) or copied from ../shared/data/tasks, so that the data
# folder is all a GPU machine needs; each file's suffix.
SUFFIX = {
  "squad_qnli": "jsonl.gz",
  "vitaminc": "jsonl.gz",
  "rotten_tomatoes": "jsonl.gz",
  "squad_split": "json.gz",
  "brown_pos": "jsonl.gz",
}
SPAN_QA = ("squad_split", "squadshifts")
# Longest input each task needs at full scale (SQuAD: the paper's 384). The reduced scales
# pretrain on config_lib.SCALED_LENGTH tokens and fine-tune on no more (positions past it are
# untrained); their SQuAD windows keep a 24-token question and advance 32 tokens.
MAX_SEQ_LENGTH = {
  "squad_qnli": 128,
  "vitaminc": 128,
  "rotten_tomatoes": 64,
  "squad_split": 384,
  "brown_pos": 64,
}
SCALED_SQUAD = {"squad.max_query_length": 24, "squad.doc_stride": 32}
# Fine-tuning seeds per run (per pretraining seed at the reduced scales: nested in it).
FINETUNE_SEEDS = {"full": 5, "gpu": 2, "cpu": 2}
LR_GRID = {"full": (5e-5, 3e-5, 2e-5), "gpu": (1e-3, 3e-4), "cpu": (1e-3, 3e-4)}


def recipe(scale: str, task: str) -> dict[str, Any]:
  """The fine-tuning recipe of `task` at `scale` (config keys of bert_jax.finetune)."""
  if scale not in config_lib.SCALES:
    raise ValueError(f"scale must be one of {', '.join(config_lib.SCALES)}, not {scale!r}")
  grid = {"grid.lr": LR_GRID[scale], "seeds": FINETUNE_SEEDS[scale], "data.batch_size": 32}
  if scale == "full":  # the paper's (A.3): 3 epochs, its lr grid, whole sets
    return {**grid, "opt.epochs": 2 if task in SPAN_QA else 3}
  # The reduced scales: subsets that fit 2 cores (squad_qnli gets more: its pairs are the task
  # pretraining must separate from the control on).
  train = {"squad_qnli": 4000, "squad_split": 1500}.get(task, 1500)
  return {
    **grid,
    "opt.epochs": 3,
    "task.max_train_examples": train,
    "task.max_eval_examples": 1000,
  }


# Left out at cpu scale: span QA (a tiny model's 64-token windows answer nothing, and a run
# costs about a pretraining point) and vitaminc (at 1,500 examples the pretrained point and the
# control both stay at the majority class on dev: docs/notes/budget.md section 6).
CPU_LEFT_OUT = (*SPAN_QA, "vitaminc")


def tasks(scale: str) -> tuple[str, ...]:
  """The suite's tasks at `scale`: every one, but not CPU_LEFT_OUT at cpu."""
  return tuple(t for t in TASKS if scale != "cpu" or t not in CPU_LEFT_OUT)


def task_files(task: str, data: str) -> dict[str, str]:
  """The task's files under an experiment's data=DIR (DIR/tasks/<task>/); without data=, none
  (the preset's own data_root)."""
  if not data:
    return {}
  path = lambda split: os.path.join(data, "tasks", task, f"{split}.{SUFFIX[task]}")
  return {f"task.{split}": path(split) for split in ("train", "dev", "test")}


def run(scale: str, task: str, data: str = "", **extra: Any) -> dict[str, Any]:
  """One task's run: the recipe, the task's length and files, and `extra` overrides on top."""
  length, squad = MAX_SEQ_LENGTH[task], {}
  if scale != "full":
    length = min(length, config_lib.SCALED_LENGTH)
    squad = SCALED_SQUAD if task in SPAN_QA else {}
  overrides = {
    **recipe(scale, task),
    "data.max_seq_length": length,
    **squad,
    **task_files(task, data),
    **extra,
  }
  return {"task": task, "overrides": overrides}


def suite(scale: str, data: str = "", **extra: Any) -> list[dict[str, Any]]:
  """One run per task of `tasks(scale)` (see `run`)."""
  return [run(scale, task, data, **extra) for task in tasks(scale)]


# The no-pretraining control's rows in the report (bert_jax/report/claims.py: CONTROL): one per
# pretraining seed of the baseline, so that the control has as many runs as a point.
CONTROL = "none"


def control(scale: str, config: Any, seed: int, data: str = "") -> list[dict[str, Any]]:
  """The no-pretraining control (BERT's premise: what pretraining brings): the suite
  fine-tuned from a random initialisation of `config.model` (the baseline point's
  architecture and init range), with the point's tokenizer (launch/sweep.py puts the point's
  workdir in for {point}). The baseline's pretraining seed `seed` gets row
  `pretraining=none,seed=SEED`, whose fine-tuning seeds start at seed x FINETUNE_SEEDS (other
  random initialisations for every row); --reuse links it between experiments."""
  from bert_jax.runtime import checkpoints  # the fields that make an architecture (param shapes)

  architecture = (*checkpoints.SHAPE_FIELDS, "initializer_range")
  model = {f"model.{k}": config.model[k] for k in architecture}
  fields = {
    "init": "",
    "data.vocab": "{point}/tokenizer",
    "seed": seed * FINETUNE_SEEDS[scale],
    **model,
  }
  row = {"pretraining": CONTROL, "seed": seed}
  return [{**r, "overrides": {**r["overrides"], **fields}, "row": row} for r in suite(scale, data)]


def only(runs: list[dict[str, Any]], tasks: str) -> list[dict[str, Any]]:
  """The runs of `tasks` ('+'-separated task names, an experiment's `tasks=` argument: a
  driver runs one task over every point first); empty: every run."""
  if not tasks:
    return runs
  wanted = tasks.split("+")
  unknown = [t for t in wanted if t not in TASKS]
  if unknown:
    raise ValueError(f"tasks={tasks}: {', '.join(unknown)} not among {', '.join(TASKS)}")
  return [r for r in runs if r["task"] in wanted]
