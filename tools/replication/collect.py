"""Copies a replication root's small files (no checkpoints) into the repository, so that the
reports are regenerated from what is committed:

  python tools/replication/collect.py --root=/work/repl_runs/cpu --output=docs/replication/runs

Per experiment root (table5, table6, masking, wwm), of the finished runs (sweep_done.json):
each pretraining run's config.json,
metrics.jsonl and sweep_done.json, and each fine-tuning run's results.json (the top level, with
every grid point's dev and test summaries, and each grid point's own, with every seed's
metrics), beside it a baselines.json (bert_jax/report/baselines.py: the task's trivial
baselines, computed here where the task files are), and the sweep's deadline.json. A point
linked from another experiment (--reuse) is copied as the files it links to. Then:

  python -m bert_jax.report --root=docs/replication/runs/table5 --paper=table5
  python -m bert_jax.report --root=docs/replication/runs --verdicts
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from absl import app, flags

from bert_jax.report import baselines

_ROOT = flags.DEFINE_string("root", None, "The replication root (replicate_cpu.sh's ROOT).")
_OUTPUT = flags.DEFINE_string("output", None, "Where the copies go (replaced per experiment).")
flags.mark_flags_as_required(["root", "output"])

EXPERIMENTS = ("table5", "table6", "masking", "wwm")
PRETRAINING = ("config.json", "metrics.jsonl", "sweep_done.json")
SKIP = ("checkpoints", "tb", "best", "tokenizer", "report", "logs", "data")


def collect(root: str, output: str) -> list[str]:
  """Copies and returns the files written (relative to `output`)."""
  written = []
  for exp in EXPERIMENTS:
    src = os.path.join(root, exp)
    if not os.path.isdir(src):
      continue
    dst_root = os.path.join(output, exp)
    if os.path.isdir(dst_root):
      shutil.rmtree(dst_root)
    for d, dirs, files in os.walk(src, followlinks=True):
      # seed_<k>/: a fine-tuning seed's own logs (its metrics are in results.json).
      dirs[:] = sorted(x for x in dirs if x not in SKIP and not x.startswith("seed_"))
      rel = os.path.relpath(d, src)
      parts = rel.split(os.sep)
      # Finished runs only (sweep_done.json): a pretraining run's own, a fine-tuning run's in
      # its task directory (<point>/finetune/<task>/, grid points below it).
      if "finetune" in parts:
        i = parts.index("finetune")
        finished = len(parts) > i + 1 and os.path.isfile(
          os.path.join(src, *parts[: i + 2], "sweep_done.json")
        )
      else:
        finished = "sweep_done.json" in files or rel == "."
      if not finished:
        continue
      names = [f for f in files if f in (*PRETRAINING, "results.json", "deadline.json")]
      if "results.json" in files:
        names = [f for f in names if f != "config.json"]  # a grid point's copy of its config
      for name in names:
        os.makedirs(os.path.join(dst_root, rel), exist_ok=True)
        shutil.copyfile(os.path.join(d, name), os.path.join(dst_root, rel, name))
        written.append(os.path.join(exp, rel, name))
      if "results.json" in files and "finetune" in parts:
        with open(os.path.join(d, "results.json")) as f:
          results = json.load(f)
        saved = {s: baselines.task_baselines(results, s) for s in ("dev", "test")}
        with open(os.path.join(dst_root, rel, baselines.SAVED), "w") as f:
          json.dump(saved, f, indent=2)
        written.append(os.path.join(exp, rel, baselines.SAVED))
  return written


def main(argv: list[str]) -> None:
  del argv
  if not os.path.isdir(_ROOT.value):
    print(f"collect.py: error: --root={_ROOT.value}: no such directory", file=sys.stderr)
    sys.exit(1)
  written = collect(_ROOT.value, _OUTPUT.value)
  size = sum(os.path.getsize(os.path.join(_OUTPUT.value, w)) for w in written)
  print(f"{len(written)} files, {size / 1e6:.1f} MB, in {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
