"""bert_jax.data.corpus: bad input skipped and counted, giant documents split, the content hash of
the input files."""

import gzip

from bert_jax.data import corpus
from bert_jax.data import pretraining as cd
from bert_jax.runtime import files
from unit._corpora import _synthetic_docs, _write_corpus


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
