r"""A regression task from real text: each Brown corpus sentence scored by its noun density
(the fraction of its words tagged as a common or proper noun, nn* or np*, by brown_pos's gold
tags), in STS-B's spirit of a real-valued target. Fine-tuned as `custom` with
`--config.task.kind=regression`:

  python tools/tasks/make_regression_task.py --data_root=../shared/data/tasks --output=/tmp/nouns
  python -m bert_jax.finetune --config=configs/finetune.py:custom,seeds=3 \
      --config.task.kind=regression --config.task.train=/tmp/nouns/train.jsonl.gz \
      --config.task.dev=/tmp/nouns/dev.jsonl.gz --config.task.test=/tmp/nouns/test.jsonl.gz \
      --config.init=CKPT --workdir=/tmp/ft_nouns

The splits are brown_pos's own (grouped by Brown document); sentences of fewer than 4 words are
left out (their density is too coarse a value).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os

NOUN_TAGS = ("nn", "np")  # Brown's tags are lower case: nn, nns, nn$, np, nps, np$, ...


def convert(src: str, dst: str, limit: int) -> int:
  n = 0
  with gzip.open(src, "rt", encoding="utf-8") as f, gzip.open(dst, "wt", encoding="utf-8") as out:
    for line in f:
      row = json.loads(line)
      words, tags = row["tokens"], row["tags_base"]
      if len(words) < 4:
        continue
      density = sum(t.startswith(NOUN_TAGS) for t in tags) / len(words)
      out.write(json.dumps({"sentence": " ".join(words), "label": round(density, 6)}) + "\n")
      n += 1
      if limit and n >= limit:
        break
  return n


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data_root", default=os.path.join("..", "shared", "data", "tasks"))
  p.add_argument("--output", required=True)
  p.add_argument("--max_examples", type=int, default=0, help="first N of each split (0 = all)")
  a = p.parse_args()
  os.makedirs(a.output, exist_ok=True)
  for split in ("train", "dev", "test"):
    src = os.path.join(a.data_root, "brown_pos", f"{split}.jsonl.gz")
    n = convert(src, os.path.join(a.output, f"{split}.jsonl.gz"), a.max_examples)
    print(f"{split}: {n} sentences")


if __name__ == "__main__":
  main()
