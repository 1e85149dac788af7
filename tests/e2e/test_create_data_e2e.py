"""The end-to-end half of tests/unit/test_create_data.py (real processes; slow): see its
docstring."""

import gzip
import os
import subprocess
import sys

import pytest
from unit.test_create_data import SAMPLE, _records

from bert_jax.data import pretraining as cd


@pytest.mark.slow
@pytest.mark.shared_data
def test_statistics_on_corpus_subset(shared_data, tmp_path):
  """First ~1/8 of the real corpus: the shares the original gives (see the README numbers)."""
  lines = []
  with gzip.open(shared_data / "corpus" / "pretrain_corpus.txt.gz", "rt") as f:
    for i, line in enumerate(f):
      if i >= 75_000 and not line.strip():
        break
      lines.append(line)
  (tmp_path / "sub.txt").write_text("".join(lines))
  s = cd.build(
    str(tmp_path / "sub.txt"), str(tmp_path / "o"), eval_fraction=0, num_workers=2, progress=False
  )["stats"]
  assert 0.43 < s["nsp_is_next_frac"] < 0.48
  # The original on this subset over 30 seeds: 16.5-18.0 masked, 15-31% shorter than 128.
  assert 16.0 < s["mean_masked_positions"] < 18.5
  assert 0.12 < s["short_128_frac"] < 0.36 and 0.03 < s["short_64_frac"] < 0.2
  _, recs = _records(str(tmp_path / "o"))
  assert max(int(r["input_mask"].sum()) for r in recs) <= 128


@pytest.mark.slow
def test_vocab_and_data_repeat_byte_for_byte(tmp_path):
  # The bundled default's path from text to records, twice, in processes with different hash
  # seeds and worker counts: every file (shards, metadata.json, tokenizer/) must be equal.
  def run(out, seed, workers):
    env = {**os.environ, "PYTHONHASHSEED": seed}
    for cmd in (
      [
        "bert_jax.train_tokenizer",
        f"--input={SAMPLE}",
        "--vocab_size=2000",
        f"--output={out}/vocab.txt",
      ],
      [
        "bert_jax.create_data",
        f"--input={SAMPLE}",
        f"--vocab={out}/vocab.txt",
        f"--output_dir={out}/data",
        "--max_seq_length=64",
        "--dupe_factor=2",
        "--nsp=false",
        "--write_masks",
        "--records_per_shard=700",
        f"--num_workers={workers}",
        "--progress=false",
      ],
    ):
      subprocess.run([sys.executable, "-m", *cmd], env=env, check=True, capture_output=True)

  # The same output path both times: metadata.json records the vocab and input paths.
  run(tmp_path / "out", "1", 1)
  (tmp_path / "out").rename(tmp_path / "a")
  run(tmp_path / "out", "2", 2)
  (tmp_path / "out").rename(tmp_path / "b")

  def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

  names = files(tmp_path / "a")
  assert names == files(tmp_path / "b")
  assert "vocab.txt" in names and "data/tokenizer/vocab.txt" in names
  assert sum(n.startswith("data/train-") for n in names) > 1  # several shards
  for name in names:
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
