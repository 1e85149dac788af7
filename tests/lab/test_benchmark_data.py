"""bert_jax.benchmark.data: the data throughput record."""

import pytest

from bert_jax.benchmark import data


def test_data_throughput_record():
  rec = data.measure_data(seq=64, batch=8, batches=5)
  assert rec["kind"] == "data" and rec["corpus_bytes"] > 100_000
  assert rec["create_data_tokens_per_s"] > rec["create_data_sequences_per_s"] > 0
  assert rec["pipeline_tokens_per_s"] == pytest.approx(rec["pipeline_batches_per_s"] * 8 * 64)
  assert 0 <= rec["padding_fraction"] < 0.5
