"""Small learnable fine-tuning tasks and tiny configs for the fine-tuning tests (test_finetune*.py,
test_tasks_*.py and their end-to-end halves): each task is built from rules a tiny randomly
initialised BERT learns in a few dozen steps, so a broken loss, head, label mapping, batching or
evaluation shows as a score near chance."""

import gzip
import importlib.util
import json
import pathlib

import numpy as np

REPO = str(pathlib.Path(__file__).resolve().parents[2])
_spec = importlib.util.spec_from_file_location("finetune_config", f"{REPO}/configs/finetune.py")
finetune_config = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(finetune_config)
WORDS = "the a man woman dog cat house city river tree car road book day night sun".split()


def _write(path, rows):
  with gzip.open(path, "wt") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(path)


def _sentences(rng, n, marker_words, p=0.5):
  """Random word sequences; each gets one marker word with probability p (its index, or -1)."""
  out = []
  for _ in range(n):
    words = list(rng.choice(WORDS, rng.integers(3, 9)))
    k = -1
    if rng.random() < p:
      k = int(rng.integers(len(marker_words)))
      words.insert(int(rng.integers(len(words) + 1)), marker_words[k])
    out.append((words, k))
  return out


def _splits(tmp_path, make, sizes=(192, 64, 64)):
  rng = np.random.default_rng(0)
  return [
    _write(tmp_path / f"{s}.jsonl.gz", make(rng, n))
    for s, n in zip(("train", "dev", "test"), sizes, strict=True)
  ]


def tiny_config(task_kind, paths, **task):
  c = finetune_config.get_config("custom,seeds=1,size=tiny")
  c.task.kind = task_kind
  c.task.train, c.task.dev, c.task.test = paths
  for k, v in task.items():
    c.task[k] = v
  c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
  c.data.max_seq_length = 16
  c.data.buckets = (8,)
  c.data.batch_size = 16
  c.data.eval_batch_size = 16
  c.opt.lr = 2e-3
  c.opt.epochs = 4
  c.opt.min_steps = 0
  c.log.every_steps = 1000
  c.ckpt.async_save = False
  return c


def sentiment(rng, n):
  rows = []
  for words, k in _sentences(rng, n, ["good", "bad"], p=1.0):
    rows.append({"sentence": " ".join(words), "label": ["pos", "neg"][k]})
  return rows


CLI_FIELDS = {
  "task.kind": "classification",
  "data.max_seq_length": 16,
  "data.buckets": (8,),
  "data.batch_size": 16,
  "data.eval_batch_size": 16,
  "opt.lr": 0.002,
  "opt.epochs": 2,
  "opt.min_steps": 0,
  "log.every_steps": 1,
  "ckpt.async_save": False,
}
