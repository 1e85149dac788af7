"""What the replication scripts' toy-size lab tests share: the paths of this checkout and of
../shared's corpus and tasks, and the sweep flags that shrink every run to a few steps."""

import os
import pathlib

REPO = str(pathlib.Path(__file__).resolve().parents[2])
SHARED = os.path.join(os.path.dirname(REPO), "shared", "data")
CORPUS = os.path.join(SHARED, "corpus", "pretrain_corpus.txt.gz")
TASK_ROOT = os.path.join(SHARED, "tasks")
# After the scripts' own flags (the last value of a flag wins): 4 pretraining steps, one
# fine-tuning seed at one lr for an epoch of 16 examples.
TOY = [
  "--config.opt.total_steps=4", "--config.opt.warmup_steps=1", "--config.eval.every_steps=0",
  "--config.eval.max_batches=2", "--finetune.seeds=1", "--finetune.grid.lr=(0.001,)",
  "--finetune.task.max_train_examples=16", "--finetune.task.max_eval_examples=16",
  "--finetune.opt.epochs=1",
]  # fmt: skip
