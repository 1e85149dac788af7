"""The count-based reference for held-out LM accuracy: what neighbour counts of the training
split predict at exactly the trainer's eval targets (static masks: the positions and
replacements `train.make_eval_step` scores). An LM that does not beat it has learned less than
a table of neighbouring tokens.

  python -m bert_jax.ngram_reference WORKDIR       # or a create_data directory

MLM: a `[MASK]` target is predicted from its (left, right) neighbours' counts, backing off to
the best product of the left and right bigram counts over the unigram count, then the left
bigram, then the most frequent token; a target shown as itself or as a random token (the 10% +
10%) is predicted as the token shown (copying). LTR: the next token from the two before it,
backing off to the one before, then the most frequent token. Ties go to the smaller token id.

The trainer adds the result to its final eval (`metrics.jsonl`: `mlm_reference_accuracy`,
`mlm_reference_accuracy_at_mask`, or `ltr_reference_accuracy`), and `bert_jax.report` puts it
beside each point's accuracy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import masking, objectives
from bert_jax.data import input_pipeline, records
from bert_jax.tokenizers import tokenizer as tokenizer_lib

_READ_BATCH = 4096  # records per read while counting


@dataclasses.dataclass(frozen=True)
class Counts:
  """Neighbour counts of a training split, as sorted keys and their counts (numpy)."""

  vocab_size: int
  unigram: np.ndarray  # [V] counts of the tokens with a left and a right neighbour
  # (left, right) -> best middle token: pair keys left * V + right, sorted, and their token.
  pair_keys: np.ndarray
  pair_best: np.ndarray
  # Bigrams as sorted keys a * V + b with counts: left[(t[i-1], t[i])], right[(t[i+1], t[i])].
  left_keys: np.ndarray
  left_counts: np.ndarray
  right_keys: np.ndarray
  right_counts: np.ndarray
  # (t[i-1], t[i]) -> best next token (LTR): keys t[i-1] * V + t[i], sorted, and the token.
  next_keys: np.ndarray
  next_best: np.ndarray

  @property
  def top(self) -> int:
    return int(np.argmax(self.unigram))


def _best_per_group(group: np.ndarray, member: np.ndarray, v: np.int64) -> tuple[np.ndarray, ...]:
  """For int64 `group` and `member` (< v) arrays of one event each: the sorted distinct groups
  and each one's most frequent member (ties: the smallest)."""
  keys, counts = np.unique(group * v + member, return_counts=True)  # by group, then member
  g = keys // v
  starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
  top = np.repeat(np.maximum.reduceat(counts, starts), np.diff(np.r_[starts, len(g)]))
  best = np.flatnonzero(counts == top)
  first = np.r_[True, g[best][1:] != g[best][:-1]]  # the smallest member reaching the max
  return g[best[first]], keys[best[first]] % v


def count_tokens(tokens: np.ndarray, starts: np.ndarray, vocab_size: int) -> Counts:
  """Counts of sequences laid end to end: `tokens` [N], sequence k at [starts[k], starts[k+1])
  (`starts` ends with N). A token counts as a middle when both neighbours are in its sequence."""
  seq = np.zeros(len(tokens), np.int32)
  seq[starts[1:-1]] = 1
  seq = np.cumsum(seq)
  inner = np.flatnonzero(seq[:-2] == seq[2:]) + 1  # the middle of a window inside one sequence
  t = tokens.astype(np.int64)
  a, b, c = t[inner - 1], t[inner], t[inner + 1]
  del t, seq, inner
  v = np.int64(vocab_size)
  pair_keys, pair_best = _best_per_group(a * v + c, b, v)
  next_keys, next_best = _best_per_group(a * v + b, c, v)
  left_keys, left_counts = np.unique(a * v + b, return_counts=True)
  right_keys, right_counts = np.unique(c * v + b, return_counts=True)
  return Counts(
    vocab_size,
    np.bincount(b, minlength=vocab_size),
    pair_keys,
    pair_best,
    left_keys,
    left_counts,
    right_keys,
    right_counts,
    next_keys,
    next_best,
  )


def count(sequences: Iterator[tuple[np.ndarray, np.ndarray]], vocab_size: int) -> Counts:
  """Counts of (input_ids [B, L], input_mask [B, L]) batches of real sequences."""
  tokens, lengths = [], []
  for ids, mask in sequences:
    mask = np.asarray(mask) > 0
    tokens.append(np.asarray(ids)[mask])
    lengths.append(mask.sum(1))
  lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
  starts = np.concatenate([[0], np.cumsum(lengths)])
  flat = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
  return count_tokens(flat, starts, vocab_size)


def _lookup(keys: np.ndarray, values: np.ndarray, query: int) -> int | None:
  i = np.searchsorted(keys, query)
  return int(values[i]) if i < len(keys) and keys[i] == query else None


def _row(keys: np.ndarray, counts: np.ndarray, first: int, v: int) -> tuple[np.ndarray, np.ndarray]:
  """The bigram row of `first`: (second tokens, counts), sorted by token."""
  lo, hi = np.searchsorted(keys, [first * v, (first + 1) * v])
  return keys[lo:hi] - first * v, counts[lo:hi]


def predict_masked(c: Counts, left: int, right: int) -> int:
  """The reference's guess for a [MASK] between `left` and `right`."""
  v = c.vocab_size
  best = _lookup(c.pair_keys, c.pair_best, left * v + right)
  if best is not None:
    return best
  lw, lc = _row(c.left_keys, c.left_counts, left, v)
  rw, rc = _row(c.right_keys, c.right_counts, right, v)
  both, li, ri = np.intersect1d(lw, rw, assume_unique=True, return_indices=True)
  if len(both):
    score = lc[li].astype(np.float64) * rc[ri] / c.unigram[both]
    return int(both[np.argmax(score)])  # first of equals: the smallest token
  if len(lw):
    return int(lw[np.argmax(lc)])
  return c.top


def predict_next(c: Counts, before: int, last: int | None) -> int:
  """The reference's guess for the token after `last` (`before` precedes it; None at the
  sequence start)."""
  v = c.vocab_size
  if before is not None:
    best = _lookup(c.next_keys, c.next_best, before * v + last)
    if best is not None:
      return best
  w, n = _row(c.left_keys, c.left_counts, last, v)
  return int(w[np.argmax(n)]) if len(w) else c.top


def _lookup_many(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
  """values[keys == query] per query, -1 where the key is absent."""
  i = np.minimum(np.searchsorted(keys, query), max(len(keys) - 1, 0))
  hit = (keys[i] == query) if len(keys) else np.zeros(len(query), bool)
  return np.where(hit, values[i] if len(keys) else -1, -1)


def score_mlm(
  c: Counts, input_ids: np.ndarray, positions: np.ndarray, targets: np.ndarray, weights, mask_id
) -> tuple[int, int, int, int]:
  """(correct, count, correct at [MASK], count at [MASK]) over a prepared MLM batch."""
  s, j = np.nonzero(np.asarray(weights) > 0)
  i = np.asarray(positions)[s, j].astype(np.int64)
  ids = np.asarray(input_ids).astype(np.int64)
  shown, target = ids[s, i], np.asarray(targets)[s, j]
  at_mask = shown == mask_id
  # A [MASK] is never first or last ([CLS], [SEP]): its neighbours exist.
  left = np.where(at_mask, ids[s, np.maximum(i - 1, 0)], 0)
  right = np.where(at_mask, ids[s, np.minimum(i + 1, ids.shape[1] - 1)], 0)
  guess = np.where(
    at_mask, _lookup_many(c.pair_keys, c.pair_best, left * c.vocab_size + right), shown
  )
  for k in np.flatnonzero(guess < 0):  # pairs never seen: the back-offs, one by one
    guess[k] = predict_masked(c, int(left[k]), int(right[k]))
  hit = guess == target
  return int(hit.sum()), len(hit), int(hit[at_mask].sum()), int(at_mask.sum())


def score_ltr(c: Counts, input_ids: np.ndarray, targets: np.ndarray, weights) -> tuple[int, int]:
  """(correct, count) over a prepared LTR batch (target t = the token at t + 1)."""
  s, t = np.nonzero(np.asarray(weights) > 0)
  ids = np.asarray(input_ids).astype(np.int64)
  last, before = ids[s, t], np.where(t > 0, ids[s, np.maximum(t - 1, 0)], -1)
  query = np.where(t > 0, before * c.vocab_size + last, -1)
  guess = _lookup_many(c.next_keys, c.next_best, query)
  for k in np.flatnonzero(guess < 0):
    guess[k] = predict_next(c, None, int(last[k]))  # (before, last) unseen: the bigram
  hit = guess == np.asarray(targets)[s, t]
  return int(hit.sum()), len(hit)


def _batches(data_dir: str, split: str, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
  return iter(
    input_pipeline.make_dataset(
      data_dir,
      split,
      global_batch_size=batch_size,
      seed=0,
      shuffle=False,
      repeat=False,
      process_index=0,
      process_count=1,
    )
  )


def train_counts(data_dir: str) -> Counts:
  """The counts of a create_data directory's training split, read record by record."""
  meta = input_pipeline.read_metadata(data_dir)
  dtype = np.dtype(meta["token_dtype"]).newbyteorder("<")
  tokens, lengths = [], []
  for f in input_pipeline.split_files(data_dir, "train", meta):
    source = grain.sources.ArrayRecordDataSource([f])
    for lo in range(0, len(source), _READ_BATCH):
      for record in source.__getitems__(range(lo, min(lo + _READ_BATCH, len(source)))):
        t = records.decode(record, dtype).tokens
        tokens.append(t)
        lengths.append(len(t))
  starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
  flat = np.concatenate(tokens) if tokens else np.zeros(0, dtype)
  return count_tokens(flat, starts, int(meta["tokenizer"]["vocab_size"]))


def reference(
  data_dir: str, obj: Any, tables: Any, eval_examples: int | None = None
) -> dict[str, float]:
  """The reference's held-out accuracy on `data_dir`'s eval split, at the masks the trainer's
  eval scores for the objective `obj` (objectives.Objective; static masks, as that eval), over
  the first `eval_examples` sequences (None: all). Keys: {mlm,ltr}_reference_accuracy, and
  mlm_reference_accuracy_at_mask."""
  counts = train_counts(data_dir)
  obj = dataclasses.replace(obj, dynamic_masking=False, nsp=False)
  prep = jax.jit(lambda b: objectives.prepare(b, obj, tables))
  totals = np.zeros(4, np.int64)
  seen = 0
  for b in _batches(data_dir, "eval", 64):
    if eval_examples is not None and seen >= eval_examples:
      break
    if eval_examples is not None and seen + len(b["input_ids"]) > eval_examples:
      keep = eval_examples - seen
      b = {k: v[:keep] for k, v in b.items()}
    seen += len(b["input_ids"])
    p = jax.device_get(prep({k: jnp.asarray(v) for k, v in b.items()}))
    if obj.ltr:
      totals[:2] += score_ltr(counts, p["input_ids"], p["targets"], p["target_weights"])
    else:
      totals += score_mlm(
        counts, p["input_ids"], p["positions"], p["targets"], p["target_weights"], tables.mask_id
      )
  lm = objectives.lm_name(obj.ltr)
  out = {f"{lm}_reference_accuracy": float(totals[0] / max(totals[1], 1))}
  if not obj.ltr:
    out["mlm_reference_accuracy_at_mask"] = float(totals[2] / max(totals[3], 1))
  return out


def for_run(path: str) -> dict[str, float]:
  """The reference for a pretraining workdir (its data and masking, from config.json and the
  data directory it trained on), or for a create_data directory alone (BERT's default
  masking: seed 0, the data's rate and max predictions, MLM)."""
  config_path = os.path.join(path, "config.json")
  if os.path.isfile(config_path):
    with open(config_path) as f:
      config = json.load(f)
    data_dir = config["data"].get("dir") or os.path.join(path, "data")
    m, o = config["masking"], config["objective"]
    ev = config.get("eval", {})
    limit = ev.get("max_batches")
    eval_examples = (
      limit * (ev.get("batch_size") or config["data"]["batch_size"]) if limit else None
    )
  else:
    data_dir = os.path.join(path, "data") if os.path.isdir(os.path.join(path, "data")) else path
    meta = input_pipeline.read_metadata(data_dir)
    m = {"seed": 0, "max_predictions": meta["max_predictions_per_seq"], "whole_word": False}
    m["prob"] = meta["masked_lm_prob"]
    o = {"mlm": True, "ltr": False}
    eval_examples = None
  obj = objectives.Objective(
    mlm=bool(o.get("mlm", True)),
    nsp=False,
    ltr=bool(o.get("ltr", False)),
    mask_seed=m["seed"],
    masking=masking.MaskingConfig(
      max_predictions=m["max_predictions"], masked_lm_prob=m["prob"], whole_word=m["whole_word"]
    ),
  )
  tok = tokenizer_lib.load_tokenizer(os.path.join(data_dir, "tokenizer"))
  return reference(data_dir, obj, masking.tables_from_tokenizer(tok), eval_examples)


def main(argv: list[str]) -> None:
  """`python -m bert_jax.ngram_reference PATH`: prints the reference's accuracies."""
  from bert_jax import cli

  if argv in (["--help"], ["-h"], ["--helpfull"]):
    try:
      print(__doc__.strip(), flush=True)
    except BrokenPipeError:  # `--help | head`
      cli._closed_pipe()
    return
  if len(argv) != 1 or argv[0].startswith("-"):
    cli.fail(PROG, "usage: python -m bert_jax.ngram_reference WORKDIR_OR_DATA_DIR", 2)
  t0 = time.perf_counter()
  try:
    out = for_run(argv[0])
  except (*cli.USER_ERRORS, KeyError) as e:
    cli.fail(PROG, e)
  print("  ".join(f"{k} {v:.4f}" for k, v in out.items()) + f"  ({time.perf_counter() - t0:.1f}s)")


PROG = "ngram_reference"

if __name__ == "__main__":
  main(sys.argv[1:])
