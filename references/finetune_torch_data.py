"""The PyTorch reference's inputs (references/finetune_torch.py): the task files read, labels,
the tokenizer, bert_jax's span-QA reading and scoring loaded without jax, BERT's encoding of
sentences, pairs and tagged words, and batches padded to their longest row."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch
import transformers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORE = -100  # transformers' "no label" index


def read_jsonl(path: str) -> list[tuple[dict[str, Any], str]]:
  """(object, "path:line") per line of a JSON-lines file (.gz allowed)."""
  opener = gzip.open if path.endswith(".gz") else open
  out = []
  with opener(path, "rt", encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        out.append((json.loads(line), f"{path}:{i}"))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{i}: not a JSON object ({e.msg})") from None
  if not out:
    raise ValueError(f"{path}: no examples")
  return out


def _field(obj: dict[str, Any], name: str, source: str) -> Any:
  if name not in obj:
    raise ValueError(f"{source}: no field {name!r}")
  return obj[name]


def read_split(path: str, args: argparse.Namespace) -> list[dict[str, Any]]:
  """Examples of one split: {"texts", "label", "source"} or {"words", "tags", "source"}."""
  out = []
  for obj, src in read_jsonl(path):
    if args.kind == "tagging":
      words = [str(w) for w in _field(obj, args.tokens_field, src)]
      tags = [str(t) for t in _field(obj, args.tags_field, src)]
      if len(words) != len(tags):
        raise ValueError(f"{src}: {len(words)} tokens but {len(tags)} tags")
      out.append({"words": words, "tags": tags, "source": src})
    else:
      texts = [str(_field(obj, f, src)) for f in args.text_fields]
      out.append({"texts": texts, "label": str(_field(obj, args.label_field, src)), "source": src})
  return out


def label_list(examples: Sequence[dict[str, Any]], kind: str) -> list[str]:
  """Sorted unique labels (tags for tagging) of `examples`, by their string form."""
  if kind == "tagging":
    return sorted({t for ex in examples for t in ex["tags"]})
  return sorted({ex["label"] for ex in examples})


def check_labels(examples: Sequence[dict[str, Any]], labels: Sequence[str], kind: str) -> None:
  known = set(labels)
  for ex in examples:
    for lab in ex["tags"] if kind == "tagging" else [ex["label"]]:
      if lab not in known:
        raise ValueError(f"{ex['source']}: label {lab!r} is not in train's labels {list(labels)}")


def lowercase(init: str) -> bool:
  """Whether the checkpoint's tokenizer lower-cases: its tokenizer_config.json's
  do_lower_case, else unless the vocab has upper-case tokens (as bert_jax.tokenizers.files reads
  it)."""
  vocab = os.path.join(init, "vocab.txt")
  if not os.path.exists(vocab):
    raise OSError(f"{init}: no vocab.txt")
  config_path = os.path.join(init, "tokenizer_config.json")
  config = json.load(open(config_path)) if os.path.exists(config_path) else {}
  with open(vocab, encoding="utf-8") as f:
    cased = any(t != t.lower() for t in f.read().split("\n") if not t.startswith("["))
  return bool(config.get("do_lower_case", not cased))


def load_tokenizer(init: str) -> transformers.BertTokenizerFast:
  """The checkpoint's vocab.txt, lower-cased or not as `lowercase` says."""
  vocab = os.path.join(init, "vocab.txt")
  lower = lowercase(init)
  return transformers.BertTokenizerFast(vocab_file=vocab, do_lower_case=lower, strip_accents=None)


def bert_jax_host_modules() -> tuple[Any, Any]:
  """bert_jax's tokenizer and tasks.squad (numpy and HF tokenizers only) without jax: the
  package bert_jax.tasks is entered without its __init__ (the device side)."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  if "bert_jax.tasks" not in sys.modules:
    package = types.ModuleType("bert_jax.tasks")
    package.__path__ = [os.path.join(REPO, "bert_jax", "tasks")]
    sys.modules["bert_jax.tasks"] = package
  from bert_jax.tasks import squad
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  return tokenizer_lib, squad


def load_qa(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
  """Span QA through bert_jax's own reader, windows (doc_stride, max_query_length,
  max-context) and decoding, so both frameworks see identical windows: (rows per split, QA
  scoring info per split, data counts). dev and test may be the same file (squadshifts): then
  the same rows."""
  tokenizer_lib, squad = bert_jax_host_modules()
  tok = tokenizer_lib.load_tokenizer(
    os.path.join(args.init, "vocab.txt"), lowercase=lowercase(args.init)
  )
  rows: dict[str, Any] = {}
  qa: dict[str, Any] = {}
  counts: dict[str, Any] = {"truncated": {}, "windows": {}, "offsets": {}}
  for split in ("train", "dev", "test"):
    path = getattr(args, split)
    if split == "test" and path == args.dev:
      rows["test"], qa["test"] = rows["dev"], qa["dev"]
      for k in ("truncated", "windows", "offsets"):
        counts[k]["test"] = counts[k]["dev"]
      counts["test"] = counts["dev"]
      continue
    examples, stats = squad.read_squad(path.split(","), args.max_examples)
    if split == "train" and args.max_train_examples:
      examples = examples[: args.max_train_examples]
    enc, metas = squad.encode_squad(
      examples, tok, args.max_seq_length, args.doc_stride, args.max_query_length,
      training=split == "train",
    )  # fmt: skip
    keys = ("input_ids", "segment_ids", "start_positions", "end_positions")
    rows[split] = [{k: r[k] for k in keys} for r in enc.rows]
    qa[split] = {"squad": squad, "tokenizer": tok, "examples": examples, "metas": metas}
    counts[split] = len(examples)
    counts["truncated"][split] = enc.n_truncated
    counts["windows"][split] = len(enc.rows)
    counts["offsets"][split] = stats
  return rows, qa, counts


def qa_score(qa: dict[str, Any], args: argparse.Namespace, starts, ends) -> dict[str, float]:
  """bert_jax's n-best decoding and the official v1.1 EM/F1 (percent), as tasks.QAInfo."""
  squad = qa["squad"]
  preds, _ = squad.decode(
    qa["examples"], qa["metas"], starts, ends, n_best=args.n_best,
    max_answer_length=args.max_answer_length, tokenizer=qa["tokenizer"],
  )  # fmt: skip
  gold = {e.qid: list(e.answers) for e in qa["examples"]}
  return squad.squad_v1_score(gold, preds)


def truncate_pair(a: list[int], b: list[int], max_len: int) -> bool:
  """BERT's `_truncate_seq_pair` in place: pop the longer one's last token (b on a tie) until
  len(a) + len(b) <= max_len. Returns whether anything was cut."""
  cut = False
  while len(a) + len(b) > max_len:
    (a if len(a) > len(b) else b).pop()
    cut = True
  return cut


def encode(
  examples: Sequence[dict[str, Any]],
  kind: str,
  tok: transformers.BertTokenizerFast,
  max_len: int,
  labels: Sequence[str],
) -> tuple[list[dict[str, Any]], int]:
  """Model rows ({"input_ids", "segment_ids", "label" | "label_ids", "gold"}) and how many
  examples lost tokens."""
  index = {lab: i for i, lab in enumerate(labels)}
  cls, sep, unk = tok.cls_token_id, tok.sep_token_id, tok.unk_token_id
  rows, n_cut = [], 0
  if kind == "tagging":
    words = [w for ex in examples for w in ex["words"]]
    pieces = tok(words, add_special_tokens=False)["input_ids"] if words else []
    at = 0
    for ex in examples:
      ids, label_ids, gold = [cls], [IGNORE], []
      room = max_len - 2
      for word_pieces, tag in zip(pieces[at : at + len(ex["words"])], ex["tags"], strict=True):
        word_pieces = word_pieces or [unk]
        if len(ids) - 1 >= room:  # this word's first sub-token is cut: the word is lost
          break
        ids += word_pieces
        label_ids += [index[tag]] + [IGNORE] * (len(word_pieces) - 1)
        gold.append(tag)
      at += len(ex["words"])
      if len(ids) - 1 > room or len(gold) < len(ex["words"]):
        n_cut += 1
        ids, label_ids = ids[: room + 1], label_ids[: room + 1]
      rows.append(
        {
          "input_ids": ids + [sep],
          "segment_ids": [0] * (len(ids) + 1),
          "label_ids": label_ids + [IGNORE],
          "gold": gold,
        }
      )
    return rows, n_cut
  n_texts = len(examples[0]["texts"])
  per_text = [
    tok([ex["texts"][k] for ex in examples], add_special_tokens=False)["input_ids"]
    for k in range(n_texts)
  ]
  for i, ex in enumerate(examples):
    a = list(per_text[0][i])
    b = list(per_text[1][i]) if n_texts == 2 else []
    if n_texts == 2:
      cut = truncate_pair(a, b, max_len - 3)
    else:
      cut = len(a) > max_len - 2
      a = a[: max_len - 2]
    n_cut += cut
    ids = [cls] + a + [sep] + (b + [sep] if n_texts == 2 else [])
    seg = [0] * (len(a) + 2) + [1] * (len(b) + 1 if n_texts == 2 else 0)
    rows.append({"input_ids": ids, "segment_ids": seg, "label": index[ex["label"]]})
  return rows, n_cut


def collate(rows: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
  """Rows padded to the longest one: input_ids, token_type_ids, attention_mask, labels."""
  n = max(len(r["input_ids"]) for r in rows)
  ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
  seg = torch.zeros((len(rows), n), dtype=torch.long)
  mask = torch.zeros((len(rows), n), dtype=torch.long)
  tagging = "label_ids" in rows[0]
  if "start_positions" in rows[0]:  # span QA: HF's argument names
    extra = {
      k: torch.tensor([int(r[k]) for r in rows], dtype=torch.long)
      for k in ("start_positions", "end_positions")
    }
  else:
    label = torch.full((len(rows), n), IGNORE, dtype=torch.long) if tagging else None
    extra = {"labels": label if tagging else torch.tensor([int(r["label"]) for r in rows])}
  for i, r in enumerate(rows):
    m = len(r["input_ids"])
    ids[i, :m] = torch.tensor(r["input_ids"])
    seg[i, :m] = torch.tensor(r["segment_ids"])
    mask[i, :m] = 1
    if tagging:
      extra["labels"][i, :m] = torch.tensor(r["label_ids"])
  return {"input_ids": ids, "token_type_ids": seg, "attention_mask": mask, **extra}
