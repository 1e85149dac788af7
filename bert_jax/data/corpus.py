"""Text documents for create_data: files (.txt/.gz, one sentence a line, a blank line between
documents; a document also ends at the end of its file) or a locally prepared TFDS text dataset.

  files = expand_inputs("corpus/*.txt.gz,extra.txt")          # runtime.files
  reader = corpus.DocumentReader(files)
  for doc in reader.documents(): ...                            # lists of stripped sentences
  corpus.content_sha256(files)                                  # what the text is, not where

Lines that are not sentences (over MAX_LINE_CHARS, NUL bytes, not UTF-8), empty and binary
files are skipped and counted (`reader.skipped`), each with a warning naming the file; a file
without blank lines is cut into pseudo-documents of at most MAX_DOC_SENTENCES sentences or
MAX_DOC_CHARS characters.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import os
from collections.abc import Iterable, Iterator

from absl import logging

from bert_jax.runtime.files import read_lines

MAX_LINE_CHARS = 100_000  # longer lines are not sentences (minified code, binary dumps): skipped
# A file without blank lines would otherwise be one document of unbounded size.
MAX_DOC_SENTENCES = 50_000
MAX_DOC_CHARS = 16 << 20


_END = object()


class DocumentReader:
  """Streams documents (lists of stripped sentences) from files, counting what it skips."""

  def __init__(self, files: list[str]):
    self.files = files
    self.skipped: collections.Counter = collections.Counter()
    self.pseudo_document_splits = 0
    self.total_bytes = sum(os.path.getsize(f) for f in files)
    self.done_bytes = 0  # input bytes fully consumed (for progress)
    self._raw = None

  def position(self) -> int:
    try:
      return self.done_bytes + (self._raw.tell() if self._raw else 0)
    except (OSError, ValueError):
      return self.done_bytes

  def _lines(self, path: str) -> Iterator[str]:
    raw = open(path, "rb")  # noqa: SIM115 -- closed below; kept to report progress
    self._raw = raw
    f = gzip.GzipFile(fileobj=raw, mode="rb") if path.endswith(".gz") else raw
    skipped = collections.Counter()
    try:
      try:
        head = f.read(1 << 16)
      except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read ({e})") from e
      if not head:
        logging.warning("create_data: %s is empty", path)
        self.skipped["empty_files"] += 1
        return
      if b"\0" in head:
        logging.warning("create_data: %s looks binary (NUL bytes): skipped", path)
        self.skipped["binary_files"] += 1
        return
      f.seek(0)
      limit = 4 * MAX_LINE_CHARS + 4  # bytes: enough for MAX_LINE_CHARS of any UTF-8
      lines = read_lines(f, limit)
      while True:
        try:
          line = next(lines, _END)
        except (OSError, EOFError) as e:
          raise ValueError(f"{path}: corrupt or truncated ({e})") from e
        if line is _END:
          break
        if line is None:
          skipped["lines_over_100k_chars"] += 1
          continue
        if b"\0" in line:
          skipped["lines_with_nul_bytes"] += 1
          continue
        try:
          text = line.decode("utf-8")
        except UnicodeDecodeError:
          skipped["non_utf8_lines"] += 1
          continue
        if len(text) > MAX_LINE_CHARS:
          skipped["lines_over_100k_chars"] += 1
          continue
        yield text.strip()
    finally:
      self.done_bytes += os.path.getsize(path)
      self._raw = None
      f.close()
      raw.close()
      for reason, n in sorted(skipped.items()):
        logging.warning("create_data: %s: skipped %d %s", path, n, reason.replace("_", " "))
      self.skipped.update(skipped)

  def documents(self) -> Iterator[list[str]]:
    for path in self.files:
      yield from self._split_documents(self._lines(path))

  def _split_documents(self, lines: Iterable[str]) -> Iterator[list[str]]:
    doc: list[str] = []
    chars = 0
    for text in lines:
      if not text:
        if doc:
          yield doc
          doc, chars = [], 0
        continue
      doc.append(text)
      chars += len(text)
      if len(doc) >= MAX_DOC_SENTENCES or chars >= MAX_DOC_CHARS:
        self.pseudo_document_splits += 1
        yield doc
        doc, chars = [], 0
    if doc:
      yield doc


def tfds_documents(name: str, data_dir: str | None, split: str, key: str):
  """(documents, size estimate) of a locally prepared TFDS text dataset (lines = sentences)."""
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise ImportError(
      "--tfds_name needs tensorflow-datasets: pip install 'bert_jax[tfds]'"
    ) from None

  try:
    builder = tfds.builder(name, data_dir=data_dir, try_gcs=False)
    source = builder.as_data_source(split=split)
  except Exception as e:  # noqa: BLE001 -- tfds raises many types; one line for the user
    raise ValueError(
      f"--tfds_name={name}: not prepared under --tfds_data_dir={data_dir} (never downloaded): {e}"
    ) from e

  def documents():
    for i in range(len(source)):
      text = source[i][key]
      if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
      doc = [s.strip() for s in text.split("\n")]
      doc = [s for s in doc if s and len(s) <= MAX_LINE_CHARS]
      if doc:
        yield doc

  return documents(), 4000 * len(source)  # ~a Wikipedia article per record


def doc_hash(doc: list[str]) -> int:
  """A stable 64-bit hash of a document's text (it decides the document's split)."""
  h = hashlib.blake2b(digest_size=8)
  for s in doc:
    h.update(s.encode("utf-8", errors="surrogatepass"))
    h.update(b"\n")
  return int.from_bytes(h.digest(), "little")


def estimate_chars(files: list[str]) -> int:
  """Rough size of the text (gzip's trailer holds the uncompressed size mod 2**32)."""
  total = 0
  for path in files:
    size = os.path.getsize(path)
    if path.endswith(".gz") and size >= 18:
      with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
      total += isize if isize >= size else 4 * size  # wrapped (> 4 GiB) or multi-member
    else:
      total += size
  return total


def content_sha256(files: list[str]) -> str:
  """sha256 over the files' bytes in the given (expand_inputs) order, each preceded by its
  length: the same text under another path (a reinstall, a copy) gives the same hex digest,
  one changed byte or a file added, dropped or reordered another."""
  h = hashlib.sha256()
  for path in files:
    h.update(os.path.getsize(path).to_bytes(8, "little"))
    with open(path, "rb") as f:
      while block := f.read(1 << 20):
        h.update(block)
  return h.hexdigest()
