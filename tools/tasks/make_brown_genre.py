r"""A sentence classification task from brown_pos: each Brown sentence labelled with its prose
kind, the corpus's own top division: "imaginative" (categories K to R: fiction, mystery,
science_fiction, adventure, romance, humor) or "informative" (A to J: news, editorial, reviews,
religion, hobbies, lore, belles_lettres, government, learned).

  python tools/tasks/make_brown_genre.py --data_root=../shared/data/tasks --output=/tmp/genre
  python -m bert_jax.finetune --config=configs/finetune.py:custom,seeds=3 \
      --config.task.train=/tmp/genre/train.jsonl.gz --config.task.dev=/tmp/genre/dev.jsonl.gz \
      --config.task.test=/tmp/genre/test.jsonl.gz --config.init=CKPT --workdir=/tmp/ft_genre

brown_pos keeps each split's sentences in document order (its first 1,500 training sentences
are all news), so each split is shuffled with a fixed seed: `task.max_train_examples` then takes
a sample of every genre. The splits stay brown_pos's (grouped by Brown document). Sentences
shorter than `--min_words` words (headlines, bylines) are dropped. Writes
`{train,dev,test}.jsonl.gz` of {"sentence", "label", "genre"} to --output.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import random
import sys

IMAGINATIVE = frozenset({"fiction", "mystery", "science_fiction", "adventure", "romance", "humor"})
SPLITS = ("train", "dev", "test")


def rows(lines, min_words: int, seed: int, source: str = "<input>") -> list[dict]:
  """brown_pos JSON lines -> shuffled {"sentence", "label", "genre"} rows; a line that is not
  a JSON object with a token list and a genre raises ValueError naming `source`:line."""
  out = []
  for n, line in enumerate(lines, 1):
    try:
      r = json.loads(line)
      tokens, genre = r["tokens"], r["genre"]
      if not isinstance(tokens, list) or not isinstance(genre, str):
        raise TypeError("tokens must be a list and genre a string")
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{source}:{n}: not a brown_pos row ({type(e).__name__}: {e})") from None
    if len(tokens) < min_words:
      continue
    label = "imaginative" if genre in IMAGINATIVE else "informative"
    out.append({"sentence": " ".join(tokens), "label": label, "genre": genre})
  random.Random(seed).shuffle(out)
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data_root", default=os.path.join("..", "shared", "data", "tasks"))
  p.add_argument("--output", required=True)
  p.add_argument("--min_words", type=int, default=5)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args()
  inputs = {s: os.path.join(a.data_root, "brown_pos", f"{s}.jsonl.gz") for s in SPLITS}
  if missing := [path for path in inputs.values() if not os.path.isfile(path)]:
    p.error(f"no brown_pos file {missing[0]} (--data_root: the folder holding brown_pos/)")
  splits = {}
  for split, path in inputs.items():  # every split is read before anything is written
    try:
      with gzip.open(path, "rt", encoding="utf-8") as f:
        splits[split] = rows(f, a.min_words, a.seed, path)
    except (OSError, EOFError, UnicodeDecodeError) as e:  # not gzip, truncated, not UTF-8
      sys.exit(f"error: {path}: {e}")
    except ValueError as e:  # rows() names the file and line
      sys.exit(f"error: {e}")
  os.makedirs(a.output, exist_ok=True)
  for split, out in splits.items():
    path = os.path.join(a.output, f"{split}.jsonl.gz")
    with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime=0: the same bytes on every run
      f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out).encode("utf-8"))
    counts = collections.Counter(r["label"] for r in out)
    print(f"{split}: {len(out)} sentences, {dict(sorted(counts.items()))}")


if __name__ == "__main__":
  main()
