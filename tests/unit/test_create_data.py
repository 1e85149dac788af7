"""create_data (bert_jax.data.pretraining's build): the same output from 1 and 2 workers,
consistent records, tokens round-trip, written masks equal on-the-fly ones, one-line errors,
output-directory safety, one dupe_factor default. The pieces it runs have files of their own
(test_data_sequences, test_data_corpus, test_data_writer, test_data_run_data)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import input_pipeline as ip
from bert_jax.data import pretraining as cd
from bert_jax.data import sequences
from bert_jax.tokenizers.tokenizer import default_vocab_path, load_tokenizer
from unit._corpora import _synthetic_docs, _write_corpus

SAMPLE = config_lib.BUNDLED_CORPUS


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(default_vocab_path())


def _records(data_dir, split="train"):
  meta = ip.read_metadata(data_dir)
  reader = ip.RecordReader(ip.split_files(data_dir, split, meta), meta)
  return meta, [reader.read(i) for i in range(len(reader))]


@pytest.fixture(scope="module")
def sample_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("cd")
  common = dict(chunk_chars=40_000, progress=False, eval_fraction=0.1, records_per_shard=300)
  one = cd.build(SAMPLE, str(root / "w1"), num_workers=1, **common)
  two = cd.build(SAMPLE, str(root / "w2"), num_workers=2, **common)
  return root, one, two


def test_output_identical_for_1_and_2_workers(sample_dirs):
  root, one, two = sample_dirs
  names = sorted(os.listdir(root / "w1"))
  assert names == sorted(os.listdir(root / "w2"))
  assert any(n.startswith("train-00001-of-") for n in names)  # several shards
  for name in names:
    if name.endswith(".array_record") or name == "metadata.json":
      assert (root / "w1" / name).read_bytes() == (root / "w2" / name).read_bytes(), name
  assert one["stats"] == two["stats"]


def test_records_are_consistent(sample_dirs, tok):
  root, summary, _ = sample_dirs
  meta, recs = _records(str(root / "w1"))
  _, eval_recs = _records(str(root / "w1"), "eval")
  assert meta["splits"]["train"]["num_sequences"] == len(recs) > 500
  assert len(eval_recs) > 0 and meta["packing"] == "nsp_pairs"
  ids = [int(r["example_id"]) for r in recs + eval_recs]
  assert ids == list(range(len(ids)))  # sequential, unique across splits
  total = 0
  for r in recs:
    n = int(r["input_mask"].sum())
    total += n
    x, seg = r["input_ids"], r["segment_ids"]
    assert n <= 128 and np.all(r["input_mask"][:n] == 1) and np.all(x[n:] == 0)
    assert x[0] == tok.cls_id and x[n - 1] == tok.sep_id
    sep = np.flatnonzero(x[:n] == tok.sep_id)
    assert len(sep) == 2  # [CLS] A [SEP] B [SEP]
    len_a = sep[0] + 1
    assert np.all(seg[:len_a] == 0) and np.all(seg[len_a:n] == 1) and np.all(seg[n:] == 0)
  assert total == meta["splits"]["train"]["num_tokens"]
  is_next = np.mean([int(r["next_sentence_label"]) == 0 for r in recs + eval_recs])
  assert is_next == pytest.approx(summary["stats"]["nsp_is_next_frac"])
  assert 0.35 < is_next < 0.6


def test_tokens_round_trip(tmp_path, tok):
  docs = [["The cat sat on the mat.", "It was happy."], ["A dog ran.", "Far away!", "Then slept."]]
  _write_corpus(tmp_path / "c.txt", docs)
  cd.build(
    str(tmp_path / "c.txt"),
    str(tmp_path / "o"),
    nsp=False,
    packing="doc_sentences",
    eval_fraction=0,
    num_workers=1,
    progress=False,
  )
  meta, recs = _records(str(tmp_path / "o"))
  assert meta["packing"] == "doc_sentences" and not meta["nsp"]
  # One record per document (documents are shuffled, so compare in sorted order).
  want = sorted(
    [tok.cls_id] + [t for s in doc for t in tok.encode(s)] + [tok.sep_id] for doc in docs
  )
  got = sorted(r["input_ids"][: int(r["input_mask"].sum())].tolist() for r in recs)
  assert got == want
  for r in recs:
    assert not r["segment_ids"].any() and r["next_sentence_label"] == 0
  assert ip.read_metadata(str(tmp_path / "o"))["tokenizer"]["fingerprint"] == tok.fingerprint
  assert load_tokenizer(str(tmp_path / "o" / "tokenizer")).fingerprint == tok.fingerprint


def test_written_masks_equal_on_the_fly_masks(tmp_path, tok):
  import jax

  from bert_jax import masking

  _write_corpus(tmp_path / "c.txt", _synthetic_docs(30))
  common = dict(eval_fraction=0, num_workers=1, progress=False, max_seq_length=64)
  cd.build(str(tmp_path / "c.txt"), str(tmp_path / "m"), write_masks=True, **common)
  cd.build(str(tmp_path / "c.txt"), str(tmp_path / "p"), **common)
  meta, masked = _records(str(tmp_path / "m"))
  _, plain = _records(str(tmp_path / "p"))
  assert meta["masking"]["max_predictions"] == 20 and meta["masking"]["seed"] == 12345
  batch = {k: np.stack([r[k] for r in plain]) for k in plain[0]}
  cfg = masking.MaskingConfig(**{k: v for k, v in meta["masking"].items() if k != "seed"})
  fly = jax.jit(
    lambda i, x, m: masking.mask_batch(
      12345, i, None, x, m, masking.tables_from_tokenizer(tok), cfg
    )
  )(batch["example_id"], batch["input_ids"], batch["input_mask"])
  for key in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    written = np.stack([r[key] for r in masked])
    np.testing.assert_array_equal(written, np.asarray(fly[key]), err_msg=key)
  assert np.asarray(fly["masked_lm_weights"]).sum() > len(plain)


def test_missing_glob_and_cli_one_line_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="no file matches"):
    cd.build(str(tmp_path / "nope*.txt"), str(tmp_path / "o"), progress=False)
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.create_data",
      f"--input={tmp_path}/nope*.txt",
      f"--output_dir={tmp_path}/o",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 1
  assert r.stderr.strip().splitlines() == [
    f"create_data: error: --input: no file matches '{tmp_path}/nope*.txt'"
  ]


def test_tfds_input_without_tensorflow_datasets_names_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # as if not installed
  with pytest.raises(ImportError) as e:
    cd.build(output_dir=str(tmp_path / "o"), tfds_name="wikipedia", progress=False)
  assert str(e.value) == "--tfds_name needs tensorflow-datasets: pip install 'bert_jax[tfds]'"
  assert not (tmp_path / "o").exists()


def test_output_dir_safety(tmp_path):
  _write_corpus(tmp_path / "c.txt", _synthetic_docs(10))
  out = tmp_path / "o"
  out.mkdir()
  (out / "notes.md").write_text("mine")
  kw = dict(eval_fraction=0, num_workers=1, progress=False)
  cd.build(str(tmp_path / "c.txt"), str(out), **kw)
  first = (out / "metadata.json").read_text()
  with pytest.raises(ValueError, match="already holds a dataset"):
    cd.build(str(tmp_path / "c.txt"), str(out), **kw)
  # A failed run (no usable text) leaves the old dataset and no temporary files.
  (tmp_path / "empty.txt").write_bytes(b"")
  with pytest.raises(ValueError, match="no sequences"):
    cd.build(str(tmp_path / "empty.txt"), str(out), overwrite=True, **kw)
  assert (out / "metadata.json").read_text() == first
  assert sorted(os.listdir(out)) == sorted(
    ["notes.md", "metadata.json", "tokenizer", "train-00000-of-00001.array_record"]
  )
  cd.build(str(tmp_path / "c.txt"), str(out), overwrite=True, seed=7, **kw)
  assert json.loads((out / "metadata.json").read_text())["seed"] == 7
  assert (out / "notes.md").read_text() == "mine"


def test_dupe_factor_has_one_default():
  """create_data's flag, the library's build and a training config's data agree."""
  import inspect

  want = sequences.DUPE_FACTOR
  assert inspect.signature(cd.build).parameters["dupe_factor"].default == want
  assert sequences.Options(vocab="v").dupe_factor == want
  assert config_lib.base_config("tiny").data.dupe_factor == want
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.create_data", "--help"], capture_output=True, text=True
  )
  help_text = " ".join(r.stdout.split())
  assert re.search(rf"--dupe_factor: .*?\(default: '{want}'\)", help_text), help_text[-500:]
