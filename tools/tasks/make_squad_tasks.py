r"""Two tasks from squadshifts (new_wiki, nyt, reddit) with train, dev and test grouped so that
no context straddles two splits:

  python tools/tasks/make_squad_tasks.py --data_root=../shared/data/tasks --output=DIR

writes
  DIR/squad_qnli/{train,dev,test}.jsonl.gz   QNLI's construction (Wang et al. 2019, GLUE): a
      question and one sentence of its paragraph, label `entailment` when the sentence holds
      the answer, `not_entailment` when it holds no reference answer. Each question gives one
      row of each (the other sentence drawn from its paragraph, seeded by the question id), so
      the classes are balanced. Fields: id, question, sentence, label.
  DIR/squad_split/{train,dev,test}.json.gz   the same questions in SQuAD v1.1 JSON (a paragraph
      an article), for span QA with a dev split to select on and a test split to report (the
      squadshifts preset's dev and test are one set).
Rows and paragraphs are shuffled (seed 0), so that the first N of a split span its domains.
  DIR/squad_qnli/meta.json, DIR/squad_split/meta.json   source, splits, counts.

Fine-tuned with the presets of configs/finetune.py (`squad_qnli`, `squad_split`, data_root=DIR).

Groups: a Wikipedia page (new_wiki) or a news article (nyt) is one group; reddit's single
"article" is a collection of unrelated posts, so there each post (context) is one. A group goes
to dev or test when the first 8 hex digits of sha256(domain/group) taken as a fraction fall
below DEV_FRACTION or DEV_FRACTION + TEST_FRACTION; the rest is train. Sentences: a paragraph
is cut at ., ! or ? followed by white space and an upper-case letter, a digit or a quote
(make_mc_task.sentences). The answer sentence is the one holding the first reference answer's
`answer_start`; a question whose offset does not point at its answer text, or whose answer
runs past its sentence, or whose paragraph has no other sentence of at least 5 words without a
reference answer, is left out of both tasks (counted in meta.json). amazon_reviews is not used:
some of its offsets do not point at their answers (../shared/data/README.md).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mc_task import sentences  # noqa: E402

DOMAINS = ("new_wiki", "nyt", "reddit")
# How each domain's contexts are grouped: by article, or (reddit) by context.
GROUP_BY = {"new_wiki": "article", "nyt": "article", "reddit": "context"}
DEV_FRACTION = TEST_FRACTION = 0.1
MIN_WORDS = 5  # a wrong sentence's least number of words
LABELS = ("entailment", "not_entailment")


def split_of(domain: str, group: str) -> str:
  """train, dev or test for a group, from the hash of its name (stable across runs)."""
  x = int(hashlib.sha256(f"{domain}/{group}".encode()).hexdigest()[:8], 16) / 16**8
  return "dev" if x < DEV_FRACTION else "test" if x < DEV_FRACTION + TEST_FRACTION else "train"


def _seeded(qid: str) -> random.Random:
  return random.Random(int(hashlib.sha256(qid.encode()).hexdigest()[:16], 16))


def paragraph_rows(p: dict, stats: dict[str, int]) -> tuple[list[dict], list[dict]]:
  """(QNLI rows, the qas kept) of one SQuAD paragraph."""
  sents = sentences(p["context"])
  rows, kept = [], []
  for qa in p["qas"]:
    stats["questions"] += 1
    answers = [a["text"] for a in qa["answers"] if a["text"].strip()]
    first = qa["answers"][0] if qa["answers"] else None
    if not first or not p["context"].startswith(first["text"], first["answer_start"]):
      stats["bad_offset"] += 1
      continue
    at = first["answer_start"]
    start, right = next((s, t) for s, t in reversed(sents) if s <= at)
    if at + len(first["text"]) > start + len(right):
      stats["answer_across_sentences"] += 1
      continue
    wrong = [
      t
      for _, t in sents
      if t != right and len(t.split()) >= MIN_WORDS and not any(a in t for a in answers)
    ]
    if not wrong:
      stats["no_other_sentence"] += 1
      continue
    other = _seeded(qa["id"]).choice(wrong)
    q = qa["question"].strip()
    rows.append(dict(id=f"{qa['id']}-0", question=q, sentence=right.strip(), label=LABELS[0]))
    rows.append(dict(id=f"{qa['id']}-1", question=q, sentence=other.strip(), label=LABELS[1]))
    kept.append(qa)
  return rows, kept


def build(data_root: str) -> tuple[dict[str, list[dict]], dict[str, dict], dict]:
  """({split: QNLI rows}, {split: SQuAD object}, stats) from the squadshifts files."""
  qnli: dict[str, list[dict]] = {s: [] for s in ("train", "dev", "test")}
  squad = {s: {"version": "1.1", "data": []} for s in qnli}
  stats = {"questions": 0, "bad_offset": 0, "answer_across_sentences": 0, "no_other_sentence": 0}
  groups = {s: 0 for s in qnli}
  for domain in DOMAINS:
    path = os.path.join(data_root, "squadshifts", f"{domain}_v1.0.json.gz")
    try:
      with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
      articles = data["data"]
    except (OSError, EOFError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{path}: not a gzipped SQuAD JSON file ({type(e).__name__})") from None
    for i, article in enumerate(articles):
      title = str(article.get("title", i))
      for j, p in enumerate(article["paragraphs"]):
        group = title if GROUP_BY[domain] == "article" else f"{title}/{j}"
        split = split_of(domain, group)
        if GROUP_BY[domain] == "context" or j == 0:
          groups[split] += 1
        rows, kept = paragraph_rows(p, stats)
        qnli[split] += rows
        if kept:
          squad[split]["data"].append(
            {"title": f"{domain}/{group}", "paragraphs": [{"context": p["context"], "qas": kept}]}
          )
  for split, rows in qnli.items():
    random.Random(0).shuffle(rows)
    random.Random(0).shuffle(squad[split]["data"])
  return qnli, squad, {**stats, "groups": groups}


def _write_gz(path: str, text: str) -> None:
  with gzip.open(path + ".tmp", "wt", encoding="utf-8") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def write(output: str, qnli: dict, squad: dict, stats: dict) -> None:
  source = "squadshifts (Miller et al. 2020): " + ", ".join(DOMAINS)
  for task in ("squad_qnli", "squad_split"):
    os.makedirs(os.path.join(output, task), exist_ok=True)
  for split, rows in qnli.items():
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    _write_gz(os.path.join(output, "squad_qnli", f"{split}.jsonl.gz"), text)
    obj = json.dumps(squad[split], ensure_ascii=False)
    _write_gz(os.path.join(output, "squad_split", f"{split}.json.gz"), obj)
  counts = {s: len(r) for s, r in qnli.items()}
  questions = {
    s: sum(len(p["qas"]) for a in squad[s]["data"] for p in a["paragraphs"]) for s in squad
  }
  meta = {
    "source": source,
    "built_by": "tools/tasks/make_squad_tasks.py",
    "groups": GROUP_BY,
    "split_groups": stats["groups"],
    "left_out": {k: v for k, v in stats.items() if k not in ("questions", "groups")},
    "questions_read": stats["questions"],
  }
  with open(os.path.join(output, "squad_qnli", "meta.json"), "w") as f:
    qnli_meta = {**meta, "task": "QNLI's construction", "labels": LABELS, "rows": counts}
    json.dump(qnli_meta, f, indent=2)
  with open(os.path.join(output, "squad_split", "meta.json"), "w") as f:
    json.dump({**meta, "task": "SQuAD v1.1 span QA", "questions": questions}, f, indent=2)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="make_squad_tasks.py", description=__doc__.split("\n\n")[0])
  p.add_argument("--data_root", default=os.path.join("..", "shared", "data", "tasks"))
  p.add_argument("--output", required=True)
  a = p.parse_args(argv)
  try:
    qnli, squad, stats = build(a.data_root)
  except ValueError as e:
    print(f"make_squad_tasks.py: error: {e}", file=sys.stderr)
    return 1
  write(a.output, qnli, squad, stats)
  for split, rows in qnli.items():
    print(f"squad_qnli {split}: {len(rows)} rows ({stats['groups'][split]} groups)")
  print("left out: " + ", ".join(f"{k} {v}" for k, v in stats.items() if k not in ("groups",)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
