"""Dumps masked pretraining batches (as bert_jax's trainer makes them) for
references/hf_reference_mlm.py: the 3,200-batch comparison with HuggingFace in
docs/notes/history.md.

  python references/dump_masked_batches.py --data_dir=WORKDIR/data --out=DIR  # e.g. local.py's
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import config_lib, masking, objectives
from bert_jax.data import input_pipeline
from bert_jax.tokenizers import tokenizer as tl

p = argparse.ArgumentParser()
p.add_argument("--data_dir", required=True)
p.add_argument("--out", required=True, help="where batches_{train,eval}.npz go")
p.add_argument("--steps", type=int, default=3200)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--max_predictions", type=int, default=10)
a = p.parse_args()
c = config_lib.base_config("tiny")
c.masking.max_predictions = a.max_predictions
c.masking.mode = "dynamic"
tok = tl.load_tokenizer(a.data_dir + "/tokenizer")
tables = masking.tables_from_tokenizer(tok)
obj = objectives.Objective.from_config(c)
prep = jax.jit(lambda b: objectives.prepare(b, obj, tables))
KEYS = (
  "input_ids",
  "segment_ids",
  "input_mask",
  "positions",
  "targets",
  "target_weights",
  "next_sentence_label",
)


def dump(split, n, shuffle, repeat):
  ds = input_pipeline.make_dataset(
    a.data_dir,
    split,
    global_batch_size=a.batch,
    seed=0,
    shuffle=shuffle,
    repeat=repeat,
    process_index=0,
    process_count=1,
    worker_count=0,
  )
  out = {}
  for i, b in enumerate(ds):
    if i == n:
      break
    prepared = prep({k: jnp.asarray(v) for k, v in b.items()})
    for k in KEYS:
      out.setdefault(k, []).append(np.asarray(prepared[k]))
  np.savez(f"{a.out}/batches_{split}.npz", **{k: np.stack(v) for k, v in out.items()})


dump("train", a.steps, True, True)
dump("eval", 10**9, False, False)
print("mask id", tok.mask_id)
