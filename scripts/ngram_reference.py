"""Count-based reference for held-out MLM accuracy: what simple neighbour statistics of the
training split predict on the eval split, masked by bert_jax's pipeline (dynamic, seed 0,
10 predictions, as configs/local.py). On the bundled default's data it gets 28.8% (24.2% at
[MASK]; the README's count-based reference).

  python scripts/ngram_reference.py WORKDIR/data

A `[MASK]` is predicted from (left, right) neighbour counts, backing off to the product of
the left and right bigram counts, then the left bigram, then the unigram; a target that is
not `[MASK]` (10% kept, 10% random) is predicted as the token shown (copying).
"""

import collections
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import config_lib, input_pipeline, masking, objectives
from bert_jax import tokenizer as tl

data_dir = sys.argv[1]
c = config_lib.base_config("tiny")
c.masking.max_predictions = 10
c.masking.mode = "dynamic"
tok = tl.load_tokenizer(data_dir + "/tokenizer")
tables = masking.tables_from_tokenizer(tok)
obj = objectives.Objective.from_config(c)
prep = jax.jit(lambda b: objectives.prepare(b, obj, tables))


def batches(split):
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


uni = collections.Counter()
left = collections.defaultdict(collections.Counter)
right = collections.defaultdict(collections.Counter)
tri = collections.defaultdict(collections.Counter)
for b in batches("train"):
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
for b in batches("eval"):
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
print(f"targets {n}  ngram acc {ok / n:.3f}  at-mask {okm / nm:.3f}  train-majority {maj / n:.3f}")
