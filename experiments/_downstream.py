"""The downstream suite every experiment fine-tunes its points on.

Not an experiment itself: each experiment file's `finetune_suite(arg)` returns `suite(scale)`,
so every point of every experiment gets the same tasks, recipe and seeds. A run is a dict:

  {"task": "rotten_tomatoes",          # a preset of configs/finetune.py
   "overrides": {"opt.lr": 1e-4, ...}, # --config.KEY=VALUE for bert_jax.finetune, seeds included
   "row": {"task": "ltr_bilstm"}}      # optional: report under this row instead of the point's

launch/sweep.py runs `python -m bert_jax.finetune --config=configs/finetune.py:TASK
--config.init=<root>/<point> --workdir=<root>/<row or point>/finetune/<task> --config.KEY=VALUE`.

Tasks stand in for the paper's: rotten_tomatoes for SST-2, vitaminc for MNLI,
squadshifts for SQuAD (the preset trains on three domains and evaluates on the fourth), and
brown_pos as the token-level task (POS accuracy separates small models; WNUT-16 entity F1 is
near zero for all of them at this scale, so it could not decide anything).

cpu scale: the models are tiny and the budget is 2 CPU cores for every point of four
experiments, so the suite is rotten_tomatoes and brown_pos (`tasks`), and each task trains on
its first 1,500 examples for 3 epochs at lr 1e-3 and is
scored on its first 1,000 dev and test examples, 3 seeds. Tiny BERTs pretrained for minutes
want a far larger lr than the paper's 2e-5..5e-5: from the tiny MLM+NSP point, 2 epochs at
1e-4 left rotten_tomatoes and vitaminc at the majority class for every seed; 3 epochs at 5e-4
gave rotten_tomatoes 0.597 / brown_pos 0.706 test, at 1e-3 0.666 / 0.784 (1 seed each).
full scale: the paper's recipe (A.3: batch 32, 3 epochs, lr 3e-5 from its {5e-5, 3e-5,
2e-5}), 5 seeds, whole sets.
"""

from __future__ import annotations

from typing import Any

from bert_jax import config_lib

TASKS = ("rotten_tomatoes", "vitaminc", "squadshifts", "brown_pos")
# Longest input each task needs at full scale (SQuAD: the paper's 384). The reduced scales
# pretrain on config_lib.SCALED_LENGTH tokens and fine-tune on no more (positions past it are
# untrained); their SQuAD windows keep a 24-token question and advance 32 tokens.
MAX_SEQ_LENGTH = {"rotten_tomatoes": 64, "vitaminc": 128, "squadshifts": 128, "brown_pos": 64}
FULL_SQUAD_LENGTH = 384
SCALED_SQUAD = {"squad.max_query_length": 24, "squad.doc_stride": 32}


def recipe(scale: str) -> dict[str, Any]:
  """The fine-tuning recipe shared by every task at `scale` (config keys of bert_jax.finetune);
  gpu, for now, the cpu one (the models it fine-tunes are the same sizes)."""
  if scale in ("cpu", "gpu"):
    return {
      "opt.lr": 1e-3,
      "data.batch_size": 32,
      "opt.epochs": 3,
      "task.max_train_examples": 1500,
      "task.max_eval_examples": 1000,
      "seeds": 3,
    }
  if scale == "full":
    return {"opt.lr": 3e-5, "data.batch_size": 32, "opt.epochs": 3, "seeds": 5}
  raise ValueError(f"scale must be one of full, cpu, gpu, not {scale!r}")


# The no-pretraining control's row in the report (bert_jax/report/claims.py: CONTROL).
CONTROL_ROW = {"pretraining": "none"}


def control(scale: str, config: Any) -> list[dict[str, Any]]:
  """The no-pretraining control (BERT's premise: what pretraining brings): the same suite
  fine-tuned from a random initialisation of `config.model` (the baseline point's
  architecture and init range), with the point's tokenizer (launch/sweep.py puts the point's
  workdir in for {point}). Its row is CONTROL_ROW; the sweep runs it once per suite and vocab
  (--reuse links it between experiments)."""
  from bert_jax import checkpoints  # the fields that make an architecture (param shapes)

  architecture = (*checkpoints.SHAPE_FIELDS, "initializer_range")
  model = {f"model.{k}": config.model[k] for k in architecture}
  fields = {"init": "", "data.vocab": "{point}/tokenizer", **model}
  return [
    {**r, "overrides": {**r["overrides"], **fields}, "row": CONTROL_ROW} for r in suite(scale)
  ]


def tasks(scale: str) -> tuple[str, ...]:
  """The suite's tasks at `scale`. cpu keeps the two where its tiny models' scores can differ
  (rotten_tomatoes, brown_pos): every point and seed of the 2026-11-24 run scored vitaminc's
  majority class, and squadshifts' F1 stays near 10 (9 to 11 on dev for the 2026-11-27 MLM +
  NSP point, 8.6 to 9.9 on test for every point of 2026-11-24), while one squadshifts run of
  64-token windows costs the 2-core budget about as much as a pretraining point (the MLM + NSP
  point's was stopped in its third seed after 10.5 minutes, the point itself took 12.8)."""
  return ("rotten_tomatoes", "brown_pos") if scale == "cpu" else TASKS


def run(scale: str, task: str, **extra: Any) -> dict[str, Any]:
  """One task's run: the shared recipe, the task's length, and `extra` overrides on top."""
  length, squad = MAX_SEQ_LENGTH[task], {}
  if scale == "full" and task == "squadshifts":
    length = FULL_SQUAD_LENGTH
  elif scale != "full":
    length = min(length, config_lib.SCALED_LENGTH)
    squad = SCALED_SQUAD if task == "squadshifts" else {}
  overrides = {**recipe(scale), "data.max_seq_length": length, **squad, **extra}
  return {"task": task, "overrides": overrides}


def suite(scale: str, **extra: Any) -> list[dict[str, Any]]:
  """One run per task of `tasks(scale)` (see `run`)."""
  return [run(scale, task, **extra) for task in tasks(scale)]
