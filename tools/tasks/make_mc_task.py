r"""A 4-way multiple-choice task from real data: given a squadshifts question, choose the
sentence of its article that contains the answer, among 4 sentences of that article. Fine-tuned
as `custom` with `--config.task.kind=multiple_choice`:

  python tools/tasks/make_mc_task.py --data_root=../shared/data/tasks --output=/tmp/sent_mc
  python -m bert_jax.finetune --config=configs/finetune.py:custom,seeds=3 \
      --config.task.name=squad_sentence_mc --config.task.kind=multiple_choice \
      --config.task.text_fields='("question", "choices")' \
      --config.task.train=/tmp/sent_mc/train.jsonl.gz --config.task.dev=/tmp/sent_mc/dev.jsonl.gz \
      --config.task.test=/tmp/sent_mc/test.jsonl.gz --config.init=CKPT --workdir=/tmp/ft_mc

Splits follow the span-QA preset: train from new_wiki, nyt and reddit; dev and test are the
first and second half of amazon_reviews' articles (a held-out domain, no article in both).

Each paragraph is cut into sentences at ., ! or ? followed by white space and an upper-case
letter, a digit or a quote. The right choice is the sentence holding the first answer's
`answer_start` (a question whose offset does not point at its text is left out); the 3 wrong
ones are drawn from the other sentences of the same article that contain no reference answer
and have at least 5 words. Questions whose article has fewer than 3 such sentences are left out.
The draw and the order of the choices are seeded by the question id: the same files every run.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re

from make_squad_subset import HELD_OUT, TRAIN

CHOICES = 4
_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'“‘])")


def sentences(text: str) -> list[tuple[int, str]]:
  """(start offset, sentence) for each sentence of `text`, in order."""
  out, start = [], 0
  for m in _BOUNDARY.finditer(text):
    out.append((start, text[start : m.start()]))
    start = m.end()
  out.append((start, text[start:]))
  return [(s, t) for s, t in out if t.strip()]


def article_examples(article: dict, stats: dict[str, int]) -> list[dict]:
  """The multiple-choice rows of one SQuAD article."""
  paragraphs = [(p, sentences(p["context"])) for p in article["paragraphs"]]
  # Distinct sentences of at least 5 words: the pool wrong choices are drawn from.
  pool = [
    t for t in dict.fromkeys(t for _, sents in paragraphs for _, t in sents) if len(t.split()) >= 5
  ]
  rows = []
  for p, sents in paragraphs:
    for qa in p["qas"]:
      stats["questions"] += 1
      answers = [a["text"] for a in qa["answers"] if a["text"].strip()]
      first = qa["answers"][0] if qa["answers"] else None
      if not first or not p["context"].startswith(first["text"], first["answer_start"]):
        stats["bad_offset"] += 1
        continue
      at = first["answer_start"]
      right = next(t for s, t in reversed(sents) if s <= at)
      ok = lambda t, right=right, answers=answers: t != right and not any(a in t for a in answers)
      rng = random.Random(int(hashlib.sha256(qa["id"].encode()).hexdigest()[:16], 16))
      # A random look at 64 of the pool first (articles run to thousands of sentences).
      wrong = [pool[i] for i in rng.sample(range(len(pool)), min(64, len(pool))) if ok(pool[i])]
      if len(wrong) < CHOICES - 1:
        wrong = [t for t in pool if ok(t)]
        if len(wrong) < CHOICES - 1:
          stats["too_few_sentences"] += 1
          continue
        wrong = rng.sample(wrong, CHOICES - 1)
      choices = [right, *wrong[: CHOICES - 1]]
      rng.shuffle(choices)
      rows.append(
        dict(id=qa["id"], question=qa["question"], choices=choices, label=choices.index(right))
      )
  return rows


def read_articles(path: str) -> list[dict]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return json.load(f)["data"]


def write(path: str, rows: list[dict]) -> None:
  with gzip.open(path, "wt", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data_root", default=os.path.join("..", "shared", "data", "tasks"))
  p.add_argument("--output", required=True)
  a = p.parse_args()
  src = lambda d: os.path.join(a.data_root, "squadshifts", f"{d}_v1.0.json.gz")
  held_out = read_articles(src(HELD_OUT))
  half = len(held_out) // 2
  splits = dict(
    train=[art for d in TRAIN for art in read_articles(src(d))],
    dev=held_out[:half],
    test=held_out[half:],
  )
  os.makedirs(a.output, exist_ok=True)
  for split, articles in splits.items():
    stats = dict(questions=0, bad_offset=0, too_few_sentences=0)
    rows = [r for art in articles for r in article_examples(art, stats)]
    write(os.path.join(a.output, f"{split}.jsonl.gz"), rows)
    print(
      f"{split}: {len(rows)} questions from {len(articles)} articles "
      f"(left out: {stats['bad_offset']} bad offsets, "
      f"{stats['too_few_sentences']} too few sentences, of {stats['questions']})"
    )


if __name__ == "__main__":
  main()
