"""create_data: BERT's sequence algorithm, bad inputs, determinism, written masks."""

import gzip
import itertools
import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import corpus, run_data, sequences
from bert_jax.data import input_pipeline as ip
from bert_jax.data import pretraining as cd
from bert_jax.data import writer as data_writer
from bert_jax.runtime import files
from bert_jax.tokenizers.tokenizer import default_vocab_path, load_tokenizer

SAMPLE = config_lib.BUNDLED_CORPUS


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(default_vocab_path())


def _records(data_dir, split="train"):
  meta = ip.read_metadata(data_dir)
  reader = ip.RecordReader(ip.split_files(data_dir, split, meta), meta)
  return meta, [reader.read(i) for i in range(len(reader))]


def _write_corpus(path, docs):
  with open(path, "w") as f:
    f.write("\n\n".join("\n".join(d) for d in docs) + "\n")


def _synthetic_docs(n_docs, seed=0):
  rng = random.Random(seed)
  words = "the a cat dog sat on mat and ran far away quick brown fox jumps over lazy".split()
  return [
    [
      " ".join(rng.choice(words) for _ in range(rng.randint(3, 25)))
      for _ in range(rng.randint(1, 40))
    ]
    for _ in range(n_docs)
  ]


def _int_docs(n_docs, rng):
  """Token ids that encode (document, position): doc d's tokens are d*10000 + 0, 1, 2, ..."""
  docs = []
  for d in range(n_docs):
    sentences, pos = [], 0
    for _ in range(rng.randint(1, 30)):
      n = rng.randint(1, 40)
      sentences.append(list(range(d * 10000 + pos, d * 10000 + pos + n)))
      pos += n
    docs.append(sentences)
  return docs


def test_nsp_pairs_follow_bert():
  rng = random.Random(0)
  docs = _int_docs(40, rng)
  out = []
  for i in range(len(docs)):
    sequences.nsp_pairs(docs, i, 64, 0.1, rng, lambda a, b, r, i=i: out.append((i, a, b, r)))
  assert len(out) > 100
  for i, a, b, random_next in out:
    assert 2 <= len(a) + len(b) <= 61 and a and b
    # Each side is one contiguous run of one document (truncation trims only the ends).
    for side in (a, b):
      assert side == list(range(side[0], side[0] + len(side)))
    assert a[0] // 10000 == i
    if random_next:
      assert b[0] // 10000 != i
    else:
      assert b[0] // 10000 == i and b[0] > a[-1]
  share = np.mean([r for *_, r in out])
  assert 0.4 < share < 0.7  # 50% plus forced random for one-sentence chunks


def test_nsp_pairs_use_every_sentence_once_when_no_random_next():
  # A 2-document corpus with long sentences: with short_seq_prob=0 all real-next pairs of a
  # document tile it; random-next pairs put the unused sentences back.
  rng = random.Random(3)
  docs = _int_docs(2, rng)
  covered = set()
  for i in range(2):

    def emit(a, b, r):
      covered.update(a)
      if not r:
        covered.update(b)

    sequences.nsp_pairs(docs, i, 512, 0.0, rng, emit)
  # Untruncated (512 is plenty): every token of both documents appears in some A or real B.
  assert covered == {t for d in docs for s in d for t in s}


def test_truncate_pair_trims_longer_side():
  rng = random.Random(0)
  a, b = sequences.truncate_pair(list(range(100)), list(range(100, 110)), 50, rng)
  assert len(a) + len(b) == 50 and len(b) == 10
  assert a == list(range(a[0], a[0] + 40)) and 0 < a[0] < 60  # trimmed at both ends


def test_packing_full_and_doc_sentences():
  docs = [[[1] * 10, [2] * 10], [[3] * 5], [[4] * 200]]
  full, per_doc = [], []
  sequences.packed(docs, 32, True, 102, lambda a, b, r: full.append(a))
  truncated = sequences.packed(docs, 32, False, 102, lambda a, b, r: per_doc.append(a))
  assert full == [[1] * 10 + [2] * 10 + [102] + [3] * 5, [4] * 30]
  assert per_doc == [[1] * 10 + [2] * 10, [3] * 5, [4] * 30] and truncated == 1


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


def test_bad_inputs_are_skipped_and_counted(tmp_path):
  good = _synthetic_docs(12)
  _write_corpus(tmp_path / "a.txt", good)
  with open(tmp_path / "b.txt", "wb") as f:
    f.write(b"valid line one\n\xff\xfe broken bytes\n" + b"x" * 150_000 + b"\nlast line\n\n")
    f.write(b"one sentence document\n")
  (tmp_path / "empty.txt").write_bytes(b"")
  (tmp_path / "bin.txt").write_bytes(b"\x00\x01\x02 binary \x00 data\n" * 10)
  with gzip.open(tmp_path / "c.gz", "wt") as f:
    f.write("gz sentence one\ngz sentence two\n")
  s = cd.build(
    str(tmp_path / "*.txt") + "," + str(tmp_path / "c.gz"),
    str(tmp_path / "o"),
    eval_fraction=0,
    num_workers=1,
    progress=False,
  )
  assert s["skipped"] == {
    "non_utf8_lines": 1,
    "lines_over_100k_chars": 1,
    "empty_files": 1,
    "binary_files": 1,
  }
  # 12 + 2 (b.txt) + 1 (c.gz) documents; b.txt's first has "valid line one" and "last line".
  assert s["stats"]["documents"] == 15
  assert s["stats"]["sentences"] == sum(map(len, good)) + 5


def test_giant_document_is_split(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus, "MAX_DOC_SENTENCES", 100)
  (tmp_path / "one.txt").write_text("".join(f"sentence number {i} here.\n" for i in range(1050)))
  s = cd.build(
    str(tmp_path / "one.txt"), str(tmp_path / "o"), eval_fraction=0, num_workers=1, progress=False
  )
  assert s["stats"]["pseudo_document_splits"] == 10 and s["stats"]["documents"] == 11


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


def test_chunks_are_random_samples_of_an_ordered_corpus(tmp_path, monkeypatch):
  """Chunks must mix the corpus even when a bucket holds many chunks in corpus order.

  The NSP "other document" comes from the chunk; chunks cut from one stretch of an ordered
  corpus (one source) gave fewer short sequences than the original's whole-corpus draw.
  """
  # Buckets of ~5 chunks, as on a corpus of > 16 GB.
  monkeypatch.setattr(data_writer, "MAX_BUCKETS", 2)
  docs = [[f"{'alpha' if d < 200 else 'beta'} {d} " + "x" * 190] for d in range(400)]
  scatter = data_writer.Scatter(str(tmp_path), 80_000, 0.0, 8_000, seed=3)
  scatter.scatter(iter(docs))
  assert scatter.num_buckets["train"] == 2
  units = list(scatter.units("train"))
  seen = sorted(int(doc[0].split()[1]) for u in units for doc in u.docs)
  assert seen == list(range(400)) and [u.index for u in units] == list(range(len(units)))
  assert len(units) >= 8
  for u in units[:-1]:  # the last one may be tiny
    alpha = np.mean([doc[0].startswith("alpha") for doc in u.docs])
    assert 0.2 < alpha < 0.8, (u.index, alpha)
  assert os.listdir(tmp_path) == []  # buckets are removed once read


def _trainer_config(corpus_path, **over):
  """A training config whose data the trainer builds itself (as configs/local.py), tiny."""
  from bert_jax import config_lib

  c = config_lib.base_config("tiny")
  c.data.input = str(corpus_path)
  c.model.vocab_size = c.data.train_vocab_size = 200
  c.data.max_seq_length = 32
  c.masking.max_predictions = 5
  c.data.dupe_factor = 1
  c.data.eval_fraction = 0.1
  c.objective.nsp = False
  for k, v in over.items():
    c[k.split(".")[0]][k.split(".")[1]] = v
  return c


def _snapshot(root):
  return {
    str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
    for p in sorted(root.rglob("*"))
    if p.is_file()
  }


def test_built_data_is_keyed_by_content_not_path(tmp_path):
  """A reinstall moves the bundled corpus: the same bytes elsewhere reuse <workdir>/data
  untouched; one changed byte (or option) is refused in one line naming the input."""
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  a, b = tmp_path / "a" / "corpus.txt", tmp_path / "b" / "corpus.txt"
  with open(SAMPLE) as f:
    lines = [ln.strip() for ln in itertools.islice(f, 300) if ln.strip()]
  _write_corpus(a, [lines[i : i + 10] for i in range(0, len(lines), 10)])
  b.write_bytes(a.read_bytes())
  wd = tmp_path / "wd"
  data_dir = run_data.ensure_built(_trainer_config(a), str(wd))
  assert data_dir == str(wd / "data")
  meta = ip.read_metadata(data_dir)
  assert meta["source"]["input_sha256"] == corpus.content_sha256([str(a)])
  assert meta["tokenizer"]["fingerprint"] == load_tokenizer(str(wd / "vocab.txt")).fingerprint
  before = _snapshot(wd)
  assert "vocab.txt" in before and "data/metadata.json" in before

  assert run_data.ensure_built(_trainer_config(b), str(wd)) == data_dir
  assert _snapshot(wd) == before  # reused: nothing rebuilt or rewritten

  text = b.read_bytes()
  i = text.index(b"Rabbit")
  b.write_bytes(text[:i] + b"H" + text[i + 1 :])  # "Rabbit" -> "Habbit": one byte
  old, new = corpus.content_sha256([str(a)])[:12], corpus.content_sha256([str(b)])[:12]
  with pytest.raises(ValueError) as e:
    run_data.ensure_built(_trainer_config(b), str(wd))
  assert str(e.value) == (
    f"{data_dir} was built from other text: the text of {b} (sha256) {old!r} -> {new!r} "
    "(built -> config); delete it to rebuild, or set config.data.dir to the data you want"
  )
  with pytest.raises(ValueError, match=r"built from other text and options: .* dupe_factor 1 -> 2"):
    run_data.ensure_built(_trainer_config(b, **{"data.dupe_factor": 2}), str(wd))
  with pytest.raises(ValueError, match=r"built with other options: dupe_factor 1 -> 2 \(built"):
    run_data.ensure_built(_trainer_config(a, **{"data.dupe_factor": 2}), str(wd))
  # Another vocab (BERT's, where the data has the corpus's own): its fingerprint differs.
  with pytest.raises(ValueError, match=r"built with other options: tokenizer '[0-9a-f]{12}' ->"):
    run_data.ensure_built(_trainer_config(a, **{"data.train_vocab_size": 0}), str(wd))
  assert _snapshot(wd) == before

  # metadata.json of an older version (no input_sha256): a clear answer, no guess.
  meta["source"].pop("input_sha256")
  (wd / "data" / "metadata.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError) as e:
    run_data.ensure_built(_trainer_config(a), str(wd))
  assert str(e.value) == (
    f"{data_dir}/metadata.json does not record the content of the text it was built from "
    "(built by an older bert_jax): delete it to rebuild, or set config.data.dir to it to use "
    "it as it is"
  )


def test_content_sha256_covers_bytes_order_and_boundaries(tmp_path):
  for d in ("p", "q"):
    (tmp_path / d).mkdir()
    (tmp_path / d / "x.txt").write_bytes(b"ab")
    (tmp_path / d / "y.txt").write_bytes(b"c")
  (tmp_path / "z.txt").write_bytes(b"abc")
  h = lambda d: corpus.content_sha256(files.expand_inputs(f"{tmp_path}/{d}/*.txt"))
  assert h("p") == h("q") and len(h("p")) == 64  # the same files elsewhere
  p, z = str(tmp_path / "p"), str(tmp_path / "z.txt")
  assert h("p") != corpus.content_sha256([f"{p}/y.txt", f"{p}/x.txt"])  # order
  assert h("p") != corpus.content_sha256([z])  # the same bytes, other file boundaries


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
