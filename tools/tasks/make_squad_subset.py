r"""The first N questions of each squadshifts domain, as SQuAD v1.1 JSON files in the same
layout (`DIR/squadshifts/{domain}_v1.0.json.gz`), for span-QA runs that fit a small machine
while still training on three domains:

  python tools/tasks/make_squad_subset.py --data_root=../shared/data/tasks --output=/tmp/sq \
      --train_questions=400 --eval_questions=600
  python -m bert_jax.finetune --config=configs/finetune.py:squadshifts,seeds=3,data_root=/tmp/sq \
      --config.init=CKPT --workdir=/tmp/ft_squad

(`task.max_train_examples` would take its N from the first training file only.) Articles and
paragraphs keep their order; the paragraph holding the N-th question is cut after it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os

TRAIN = ("new_wiki", "nyt", "reddit")  # as configs/finetune.py's squadshifts preset
HELD_OUT = "amazon_reviews"


def first_questions(data: dict, n: int) -> dict:
  """`data` (a SQuAD file's object) cut after its first n questions."""
  articles, left = [], n
  for article in data["data"]:
    paragraphs = []
    for p in article["paragraphs"]:
      if left <= 0:
        break
      paragraphs.append({**p, "qas": p["qas"][:left]})
      left -= len(paragraphs[-1]["qas"])
    if paragraphs:
      articles.append({**article, "paragraphs": paragraphs})
    if left <= 0:
      break
  return {**data, "data": articles}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data_root", default=os.path.join("..", "shared", "data", "tasks"))
  p.add_argument("--output", required=True)
  p.add_argument("--train_questions", type=int, required=True, help="per training domain")
  p.add_argument("--eval_questions", type=int, required=True, help="of " + HELD_OUT)
  a = p.parse_args()
  os.makedirs(os.path.join(a.output, "squadshifts"), exist_ok=True)
  for domain in (*TRAIN, HELD_OUT):
    name = os.path.join("squadshifts", f"{domain}_v1.0.json.gz")
    with gzip.open(os.path.join(a.data_root, name), "rt", encoding="utf-8") as f:
      data = json.load(f)
    n = a.eval_questions if domain == HELD_OUT else a.train_questions
    cut = first_questions(data, n)
    with gzip.open(os.path.join(a.output, name), "wt", encoding="utf-8") as f:
      json.dump(cut, f, ensure_ascii=False)
    count = sum(len(p["qas"]) for art in cut["data"] for p in art["paragraphs"])
    print(f"{domain}: {count} questions from {len(cut['data'])} articles")


if __name__ == "__main__":
  main()
