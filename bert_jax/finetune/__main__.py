r"""Fine-tuning and downstream evaluation: `python -m bert_jax.finetune`.

  python -m bert_jax.finetune --config=configs/finetune.py:rotten_tomatoes \
      --config.init=/tmp/bert_local --workdir=/tmp/ft_rt

`config.init` is any checkpoint the one loader reads (a pretraining workdir or orbax step, a
HuggingFace or Google BERT, a params dir); its tokenizer comes with it. The run reuses the
trainer's machinery: mesh and logical-axis shardings, the optimizer (AdamW, warmup then linear
decay, weight decay not on LayerNorm/bias), the guarded update, orbax checkpoints, the
workdir lock, preemption, metrics.jsonl/TensorBoard and the progress line.

Per seed (`config.seeds` restarts; seed k uses `config.seed + k` for head init, data order and
dropout), in `<workdir>/seed_<k>/`: train for `opt.epochs` epochs, evaluate on dev every
epoch (or every `eval.every_steps`), keep the best dev point as a params dir (`best/`, with
task.json; `python -m bert_jax.convert` exports it to HuggingFace) and score test at that
point. `<workdir>/results.json` holds every seed's dev and test metrics and, per metric,
mean/std/median/min/max. A preempted or killed run resumes where it stopped: finished seeds are
kept, the running one resumes from its checkpoint bit-exactly.

`config.grid` (e.g. the paper's lr {5e-5, 3e-5, 2e-5} x batch {16, 32} x epochs {2, 3, 4})
runs every point under `<workdir>/<point>/` and selects the point with the best mean dev
score; the top-level results.json is that point's, plus the whole grid.

Batches are bucketed by length (`data.buckets`): each batch is padded to the smallest bucket
that holds its longest row, so a step compiles once per bucket. Dev and test are scored whole:
the last batch is padded with weight-0 rows, never dropped.
"""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.finetune import schema as ft_schema

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "configs/finetune.py:TASK[,key=value] (or the bundled name finetune:TASK).",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the run (results.json, seeds).")
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed", False, "Call jax.distributed.initialize() (multi-host)."
)
_CPU_DEVICES = flags.DEFINE_integer("num_cpu_devices", None, "Fake this many CPU devices.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  del argv
  import jax

  if _CPU_DEVICES.value:
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  from bert_jax.finetune import grid, inputs
  from bert_jax.runtime import multihost
  from bert_jax.runtime import preemption as preemption_lib

  preemption_lib.install(defer=_DISTRIBUTED.value)  # several processes stop together
  if _DISTRIBUTED.value:
    multihost.initialize("finetune")
  config = _CONFIG.value
  inputs.check_size_overrides(config, config_flags.get_override_values(flags.FLAGS["config"]))
  try:
    result = grid.finetune(config, _WORKDIR.value)
  except preemption_lib.Preempted:  # before training; with several processes, all of them
    if _DISTRIBUTED.value:
      multihost.shutdown()
    raise
  except Exception:
    multihost.wait_for_lost_peer()  # a lost peer ends the process in one line, exit 75
    raise
  if _DISTRIBUTED.value:
    multihost.shutdown()
  if result.get("preempted"):
    sys.exit(preemption_lib.EXIT_PREEMPTED)


def run() -> None:
  """`python -m bert_jax.finetune` and the console script. Exit status: 0 done; 75 preempted
  after saving (rerun to resume); 1 an error a user can fix (one line); 2 a bad flag or
  config."""
  from bert_jax.runtime import preemption as preemption_lib

  preemption_lib.run_command(
    lambda: cli.run(
      main,
      "finetune",
      compilation_cache=True,
      check=lambda: ft_schema.check_finetuning(_CONFIG.value),
    )
  )


if __name__ == "__main__":
  run()
