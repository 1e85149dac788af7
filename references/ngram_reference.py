"""Count-based reference for held-out MLM accuracy: what simple neighbour statistics of the
training split predict on the eval split, at exactly the trainer's eval masks (static: the
same positions and replacements `train.make_eval_step` scores). The masking settings (mask
seed, rate, max predictions, whole-word) are the run's, read from WORKDIR/config.json, or the
data's defaults when given a data directory alone. On configs/local.py's data (its one held-out
document, 451 targets) it gets 31.0%, 27.1% at [MASK], where the model reaches 34.2% and 31.2%;
the training split's most frequent token 6.2%.

  python references/ngram_reference.py WORKDIR        # or WORKDIR/data

A `[MASK]` is predicted from (left, right) neighbour counts, backing off to the product of
the left and right bigram counts, then the left bigram, then the unigram; a target that is
not `[MASK]` (10% kept, 10% random) is predicted as the token shown (copying). It prints the
accuracy over all targets and at `[MASK]` only (the trainer's mlm_accuracy and
mlm_accuracy_at_mask), and that of always predicting the training split's most frequent token.
"""

import collections
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import input_pipeline, masking, objectives
from bert_jax import tokenizer as tl


def settings(path: str) -> tuple[str, objectives.Objective]:
  """(data dir, the eval's objective) of a workdir or a data directory."""
  data_dir = os.path.join(path, "data") if os.path.isdir(os.path.join(path, "data")) else path
  meta = input_pipeline.read_metadata(data_dir)
  config_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)), "config.json")
  if os.path.isfile(config_path):
    with open(config_path) as f:
      m = json.load(f)["masking"]
    print(f"masking of {config_path}: {m}")
  else:
    m = {"seed": 0, "max_predictions": meta["max_predictions_per_seq"], "whole_word": False}
    m["prob"] = meta["masked_lm_prob"]
    print(f"no config.json beside {data_dir}: masking {m}")
  cfg = masking.MaskingConfig(
    max_predictions=m["max_predictions"], masked_lm_prob=m["prob"], whole_word=m["whole_word"]
  )
  # Static, as the trainer's eval (whatever the training masking mode).
  return data_dir, objectives.Objective(
    nsp=False, dynamic_masking=False, mask_seed=m["seed"], masking=cfg
  )


def batches(data_dir, split):
  return input_pipeline.make_dataset(
    data_dir,
    split,
    global_batch_size=8,
    seed=0,
    shuffle=False,
    repeat=False,
    process_index=0,
    process_count=1,
    worker_count=0,
  )


def main(path: str) -> None:
  data_dir, obj = settings(path)
  tok = tl.load_tokenizer(os.path.join(data_dir, "tokenizer"))
  tables = masking.tables_from_tokenizer(tok)
  prep = jax.jit(lambda b: objectives.prepare(b, obj, tables))

  uni = collections.Counter()
  left = collections.defaultdict(collections.Counter)
  right = collections.defaultdict(collections.Counter)
  tri = collections.defaultdict(collections.Counter)
  for b in batches(data_dir, "train"):
    for ids, m in zip(b["input_ids"], b["input_mask"], strict=True):
      t = ids[m.astype(bool)].tolist()
      for i in range(1, len(t) - 1):
        uni[t[i]] += 1
        left[t[i - 1]][t[i]] += 1
        right[t[i + 1]][t[i]] += 1
        tri[(t[i - 1], t[i + 1])][t[i]] += 1
  top = uni.most_common(1)[0][0]

  def predict(lft, rgt):
    if (lft, rgt) in tri:
      return tri[(lft, rgt)].most_common(1)[0][0]
    cands = set(left[lft]) & set(right[rgt])
    if cands:
      return max(cands, key=lambda w: left[lft][w] * right[rgt][w] / uni[w])
    if left[lft]:
      return left[lft].most_common(1)[0][0]
    return top

  n = ok = okm = nm = maj = 0
  for b in batches(data_dir, "eval"):
    p = prep({k: jnp.asarray(v) for k, v in b.items()})
    ids, pos, tg, w = (
      np.asarray(p[k]) for k in ("input_ids", "positions", "targets", "target_weights")
    )
    for s in range(ids.shape[0]):
      for j in range(pos.shape[1]):
        if w[s, j] == 0:
          continue
        i = pos[s, j]
        x = ids[s, i]
        guess = predict(ids[s, i - 1], ids[s, i + 1]) if x == tok.mask_id else x
        n += 1
        ok += guess == tg[s, j]
        maj += tg[s, j] == top
        if x == tok.mask_id:
          nm += 1
          okm += guess == tg[s, j]
  print(
    f"targets {n}  ngram acc {ok / n:.3f}  at-mask {okm / nm:.3f}  train-majority {maj / n:.3f}"
  )


if __name__ == "__main__":
  main(sys.argv[1])
