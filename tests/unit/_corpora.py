"""Small corpora written for the data tests (test_create_data, test_data_*.py)."""

import random


def _write_corpus(path, docs):
  with open(path, "w") as f:
    f.write("\n\n".join("\n".join(d) for d in docs) + "\n")


def _synthetic_docs(n_docs, seed=0):
  rng = random.Random(seed)
  words = "the a cat dog sat on mat and ran far away quick brown fox jumps over lazy".split()
  return [
    [
      " ".join(rng.choice(words) for _ in range(rng.randint(3, 25)))
      for _ in range(rng.randint(1, 40))
    ]
    for _ in range(n_docs)
  ]
