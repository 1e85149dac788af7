"""Data throughput: `pretraining_data.build` (what create_data runs) on the bundled corpus,
then the input pipeline reading the records back."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from bert_jax.data import input_pipeline
from bert_jax.data import pretraining as pretraining_data
from bert_jax.tokenizers import tokenizer as tokenizer_lib


def measure_data(seq: int = 128, batch: int = 32, batches: int = 50) -> dict[str, Any]:
  """Sequences and tokens per second of the data build (one worker, dupe_factor 1), batches and
  tokens per second of the input pipeline, and the padding fraction of its batches."""
  corpus = os.path.join(
    os.path.dirname(tokenizer_lib.default_vocab_path()), "sample_public_domain.txt"
  )
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "data")
    t0 = time.perf_counter()
    summary = pretraining_data.build(
      corpus, out, max_seq_length=seq, dupe_factor=1, num_workers=1, progress=False
    )
    build_s = time.perf_counter() - t0
    train = summary["splits"]["train"]
    ds = input_pipeline.make_dataset(
      out, "train", global_batch_size=batch, seed=0, process_index=0, process_count=1
    )
    it = iter(ds)
    next(it)  # starts the pipeline's readers
    t0 = time.perf_counter()
    real = 0
    for _ in range(batches):
      real += int(next(it)["input_mask"].sum())
    read_s = time.perf_counter() - t0
  return {
    "kind": "data",
    "seq": seq,
    "corpus_bytes": os.path.getsize(corpus),
    "create_data_s": build_s,
    "create_data_sequences_per_s": train["num_sequences"] / build_s,
    "create_data_tokens_per_s": train["num_tokens"] / build_s,
    "pipeline_batches_per_s": batches / read_s,
    "pipeline_tokens_per_s": batches * batch * seq / read_s,
    "padding_fraction": 1.0 - real / (batches * batch * seq),
  }
