"""Text documents -> BERT pretraining sequences -> ArrayRecord shards + metadata.json.

The library behind `python -m bert_jax.create_data` (its flags are the arguments of `build`) and
the trainer's first-use data build:

  summary = pretraining_data.build("corpus/*.txt.gz", "DIR", vocab="vocab.txt")

Input: one sentence a line, a blank line between documents (the original BERT format); .txt or
.gz, comma-separated globs; or a local TFDS text dataset (--tfds_name, --tfds_data_dir; never
downloaded). A document also ends at the end of its file.

Sequences follow google-research/bert `create_instances_from_document`: a target length of
max_seq_length - 3 (a random shorter one with probability short_seq_prob, drawn per document),
sentences accumulated until the chunk reaches it, segment A a random prefix of the chunk, B its
real continuation (50%) or a random span of another document (unused sentences are put back),
then the longer segment trimmed at a random end until the pair fits. `--dupe_factor` passes
re-draw segmentation and pairing (the original's default was 10; ours is 1 because masking is
done on the fly, see bert_jax.masking). With --nsp=False sentences are packed up to
max_seq_length - 2 tokens (RoBERTa FULL-SENTENCES, a [SEP] between documents; or
DOC-SENTENCES, never crossing a document boundary); a sentence longer than that is truncated.

Streaming, parallel and deterministic: a first pass scatters documents over random bucket files
of about a chunk each (an external shuffle); each bucket is then read and shuffled in memory and
chunks of ~4 MB of text are cut from them, so every chunk is a uniform random sample of the
corpus whatever its order and size. Each chunk is an independent work unit (tokenize with
`encode_batch`, build sequences) whose random generator is seeded from (seed, split, dupe pass,
chunk index); the random "other document" for NSP comes from the same chunk. Workers (spawned
processes) run units; the parent writes results in chunk order and numbers examples
sequentially, so the output is byte-identical for any --num_workers, and at most a few chunks
are in memory at once (the buckets take about the size of the uncompressed text, in a
temporary directory inside --output_dir).

Held-out documents (--eval_fraction) are chosen by a hash of their text (duplicates land in the
same split); a corpus that fits in one chunk gets at least 3 eval documents (at most a tenth of
its documents, and at least one). Eval documents are
grouped into their own chunks and get a single pass (no dupes).

Output (the record format is bert_jax.records): DIR/{train,eval}-NNNNN-of-NNNNN
.array_record, DIR/tokenizer/, DIR/metadata.json. Everything is written under a temporary
directory and renamed at the end, metadata.json last.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import hashlib
import itertools
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from absl import logging

from bert_jax import records

MAX_LINE_CHARS = 100_000  # longer lines are not sentences (minified code, binary dumps): skipped
# A file without blank lines would otherwise be one document of unbounded size.
MAX_DOC_SENTENCES = 50_000
MAX_DOC_CHARS = 16 << 20
CHUNK_CHARS = 4 << 20  # text per work unit
# Buckets of about a chunk each up to 16 GB of text (bigger corpora get bigger buckets, each
# still shuffled in memory); write buffers share a fixed budget.
MAX_BUCKETS = 4096
BUFFER_BUDGET_CHARS = 256 << 20
MIN_EVAL_DOCS = 3
_SPLIT_CODE = {"train": 0, "eval": 1}
PACKINGS = ("nsp_pairs", "full_sentences", "doc_sentences")


@dataclasses.dataclass(frozen=True)
class Options:
  """Everything that shapes the output (also what workers need)."""

  vocab: str
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  dupe_factor: int = 1
  seed: int = 12345
  nsp: bool = True
  packing: str = "full_sentences"  # used when nsp=False
  eval_fraction: float = 0.01
  write_masks: bool = False
  whole_word_mask: bool = False

  @property
  def layout(self) -> str:
    return "nsp_pairs" if self.nsp else self.packing

  def validate(self) -> None:
    if not 8 <= self.max_seq_length <= 65535:
      raise ValueError(f"--max_seq_length must be in [8, 65535], got {self.max_seq_length}")
    if self.dupe_factor < 1:
      raise ValueError(f"--dupe_factor must be >= 1, got {self.dupe_factor}")
    if not 0.0 <= self.short_seq_prob <= 1.0:
      raise ValueError(f"--short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ValueError(f"--eval_fraction must be in [0, 1), got {self.eval_fraction}")
    if not self.nsp and self.packing not in ("full_sentences", "doc_sentences"):
      raise ValueError(f"--packing must be full_sentences or doc_sentences, got {self.packing!r}")
    if not 0 < self.max_predictions_per_seq <= self.max_seq_length:
      raise ValueError(
        f"--max_predictions_per_seq must be in [1, max_seq_length], got "
        f"{self.max_predictions_per_seq}"
      )


# ----------------------------------------------------------------------------- reading


def expand_inputs(patterns: str) -> list[str]:
  """Comma-separated globs -> sorted, de-duplicated files; a glob matching nothing is an error."""
  files: list[str] = []
  for pattern in patterns.split(","):
    pattern = pattern.strip()
    if not pattern:
      continue
    matches = sorted(m for m in glob.glob(os.path.expanduser(pattern), recursive=True))
    matches = [m for m in matches if os.path.isfile(m)]
    if not matches:
      raise FileNotFoundError(f"--input: no file matches {pattern!r}")
    files.extend(matches)
  if not files:
    raise ValueError("--input is empty")
  return list(dict.fromkeys(files))


class _Reader:
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
      while True:
        try:
          line = f.readline(limit)
        except (OSError, EOFError) as e:
          raise ValueError(f"{path}: corrupt or truncated ({e})") from e
        if not line:
          break
        if len(line) >= limit and not line.endswith(b"\n"):
          while True:  # drain the rest of the line in bounded pieces
            rest = f.readline(limit)
            if not rest or rest.endswith(b"\n"):
              break
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


def _tfds_documents(name: str, data_dir: str | None, split: str, key: str):
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


def _doc_hash(doc: list[str]) -> int:
  h = hashlib.blake2b(digest_size=8)
  for s in doc:
    h.update(s.encode("utf-8", errors="surrogatepass"))
    h.update(b"\n")
  return int.from_bytes(h.digest(), "little")


@dataclasses.dataclass
class _Unit:
  split: str
  index: int
  docs: list[list[str]]


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


def _seeded_rng(*parts) -> random.Random:
  """A generator seeded from a hash of parts (stable across processes and Python versions)."""
  key = "/".join(map(str, parts)).encode()
  return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))


class _Scatter:
  """Pass 1: routes documents to train/eval and scatters them over random bucket files.

  Pass 2 shuffles each bucket in memory and cuts chunks from it, so each chunk is a uniform
  random sample of the corpus and the random "other document" of NSP is as representative as in
  the original (which draws from the whole corpus). A bucket alone keeps the corpus order: a
  chunk cut from an unshuffled bucket bigger than a chunk, or spanning two buckets, would draw
  its "other documents" from one stretch of the corpus (one source), which changes the length
  statistics. Memory: a write buffer per bucket (a fixed total); one bucket when reading.
  """

  MAX_BUFFER_CHARS = 1 << 20
  MIN_BUFFER_CHARS = 64 << 10

  def __init__(
    self, directory: str, est_chars: int, eval_fraction: float, chunk_chars: int, seed: int
  ):
    self.directory = directory
    self.eval_fraction = eval_fraction
    self.chunk_chars = chunk_chars
    self.seed = seed
    self.rng = random.Random(seed)
    self.num_buckets = {
      "train": min(MAX_BUCKETS, max(1, -(-est_chars // chunk_chars))),
      "eval": min(MAX_BUCKETS, max(1, -(-int(est_chars * eval_fraction) // chunk_chars))),
    }
    per_bucket = BUFFER_BUDGET_CHARS // sum(self.num_buckets.values())
    self.buffer_chars = min(self.MAX_BUFFER_CHARS, max(self.MIN_BUFFER_CHARS, per_bucket))
    self.buffers = {(s, b): [] for s, n in self.num_buckets.items() for b in range(n)}
    self.buffered = dict.fromkeys(self.buffers, 0)
    self.documents = {"train": 0, "eval": 0}

  def _path(self, split: str, bucket: int) -> str:
    return os.path.join(self.directory, f"{split}-{bucket:04d}.txt")

  def _flush(self, key) -> None:
    if self.buffers[key]:
      with open(self._path(*key), "a", encoding="utf-8", errors="surrogatepass") as f:
        f.write("".join(self.buffers[key]))
      self.buffers[key] = []
      self.buffered[key] = 0

  def _add(self, split: str, doc: list[str]) -> None:
    key = (split, self.rng.randrange(self.num_buckets[split]))
    text = "\n".join(doc) + "\n\n"
    self.buffers[key].append(text)
    self.buffered[key] += len(text)
    self.documents[split] += 1
    if self.buffered[key] >= self.buffer_chars:
      self._flush(key)

  def scatter(self, docs: Iterator[list[str]], report=lambda: None) -> None:
    # Buffer one chunk first: if the corpus ends inside it, it is "small" and gets at least
    # MIN_EVAL_DOCS eval documents (the smallest hashes); otherwise a hash threshold decides.
    first: list[list[str]] = []
    size = 0
    small = True
    for doc in docs:
      first.append(doc)
      size += sum(map(len, doc))
      if size >= self.chunk_chars:
        small = False
        break
    eval_ids: set[int] = set()
    if small and self.eval_fraction > 0 and len(first) > 1:
      # Never more than a tenth of a tiny corpus (the bundled sample has 15 documents).
      n = len(first)
      k = min(max(MIN_EVAL_DOCS, round(self.eval_fraction * n)), max(1, n // 10))
      eval_ids = set(sorted(range(n), key=lambda i: (_doc_hash(first[i]), i))[:k])
    threshold = int(self.eval_fraction * 2**64)
    i = 0
    for source in (first, docs):
      for doc in source:
        if small:
          self._add("eval" if i in eval_ids else "train", doc)
        else:
          self._add("eval" if _doc_hash(doc) < threshold else "train", doc)
        i += 1
        if i % 1024 == 0:
          report()
    for key in self.buffers:
      self._flush(key)
    report()

  def _read_bucket(self, split: str, bucket: int) -> list[list[str]]:
    path = self._path(split, bucket)
    if not os.path.exists(path):
      return []
    docs: list[list[str]] = []
    with open(path, encoding="utf-8", errors="surrogatepass") as f:
      doc: list[str] = []
      for line in f:
        line = line.rstrip("\n")
        if line:
          doc.append(line)
        else:
          docs.append(doc)
          doc = []
    os.remove(path)
    return docs

  def units(self, split: str) -> Iterator[_Unit]:
    """Pass 2: chunks of ~chunk_chars of text from the shuffled buckets, one after another.

    A chunk spanning two buckets joins random subsets of two random samples: still random.
    """
    index = 0
    pending: list[list[str]] = []
    size = 0
    for bucket in range(self.num_buckets[split]):
      docs = self._read_bucket(split, bucket)
      _seeded_rng(self.seed, "bucket", split, bucket).shuffle(docs)
      for doc in docs:
        pending.append(doc)
        size += sum(map(len, doc))
        if size >= self.chunk_chars:
          yield _Unit(split, index, pending)
          index += 1
          pending, size = [], 0
    if pending:
      yield _Unit(split, index, pending)


# ----------------------------------------------------------------------------- sequences


def _unit_rng(seed: int, split: str, dupe: int, chunk: int) -> random.Random:
  return _seeded_rng(seed, split, dupe, chunk)


def _truncate_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random):
  """BERT's truncate_seq_pair: trim the longer side at a random end until the pair fits."""
  a0, a1, b0, b1 = 0, len(a), 0, len(b)
  while (a1 - a0) + (b1 - b0) > max_num_tokens:
    front = rng.random() < 0.5
    if a1 - a0 > b1 - b0:
      if front:
        a0 += 1
      else:
        a1 -= 1
    elif front:
      b0 += 1
    else:
      b1 -= 1
  return a[a0:a1], b[b0:b1]


def _nsp_pairs(
  docs: list[list[list[int]]],
  index: int,
  max_seq_length: int,
  short_seq_prob: float,
  rng: random.Random,
  emit,
) -> None:
  """Sequences of one document, as BERT's create_instances_from_document (before masking)."""
  document = docs[index]
  max_num_tokens = max_seq_length - 3
  target = max_num_tokens
  if rng.random() < short_seq_prob:
    target = rng.randint(2, max_num_tokens)
  chunk: list[list[int]] = []
  length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    length += len(document[i])
    if i == len(document) - 1 or length >= target:
      a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
      tokens_a = [t for s in chunk[:a_end] for t in s]
      tokens_b: list[int] = []
      if len(chunk) == 1 or rng.random() < 0.5:
        is_random_next = True
        target_b = target - len(tokens_a)
        for _ in range(10):  # avoid the same document (a one-document chunk cannot)
          other = rng.randint(0, len(docs) - 1)
          if other != index:
            break
        other_doc = docs[other]
        for j in range(rng.randint(0, len(other_doc) - 1), len(other_doc)):
          tokens_b.extend(other_doc[j])
          if len(tokens_b) >= target_b:
            break
        i -= len(chunk) - a_end  # put the unused sentences back
      else:
        is_random_next = False
        tokens_b = [t for s in chunk[a_end:] for t in s]
      tokens_a, tokens_b = _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
      emit(tokens_a, tokens_b, is_random_next)
      chunk, length = [], 0
    i += 1


def _packed(
  docs: list[list[list[int]]], max_seq_length: int, cross_documents: bool, sep_id: int, emit
) -> int:
  """Full sentences packed up to max_seq_length - 2 tokens; returns #truncated sentences."""
  cap = max_seq_length - 2
  truncated = 0
  current: list[int] = []
  doc_break = False
  for doc in docs:
    for sentence in doc:
      if len(sentence) > cap:
        sentence = sentence[:cap]
        truncated += 1
      extra = 1 if (doc_break and current) else 0
      if current and len(current) + extra + len(sentence) > cap:
        emit(current, [], False)
        current, extra = [], 0
      if extra:
        current.append(sep_id)  # RoBERTa's separator between documents
      doc_break = False
      current.extend(sentence)
    if cross_documents:
      doc_break = True
    elif current:
      emit(current, [], False)
      current = []
  if current:
    emit(current, [], False)
  return truncated


# ----------------------------------------------------------------------------- workers

_WORKER: dict[str, Any] = {}


def _init_worker(opts: Options) -> None:
  from bert_jax.tokenizer import load_tokenizer

  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  _WORKER["opts"] = opts
  _WORKER["tok"] = load_tokenizer(opts.vocab)


def _process_unit(unit: _Unit) -> dict[str, Any]:
  """Tokenizes one chunk and builds its sequences (all dupe passes)."""
  opts: Options = _WORKER["opts"]
  tok = _WORKER["tok"]
  texts = [s for doc in unit.docs for s in doc]
  ids = tok.encode_batch(texts)
  docs: list[list[list[int]]] = []
  k = 0
  no_tokens = 0
  for doc in unit.docs:
    tdoc = []
    for _ in doc:
      if ids[k]:
        tdoc.append(ids[k])
      else:
        no_tokens += 1
      k += 1
    if tdoc:
      docs.append(tdoc)
  del ids, texts

  cls, sep = tok.cls_id, tok.sep_id
  tokens: list[int] = []
  lengths: list[int] = []
  len_as: list[int] = []
  labels: list[int] = []

  def emit(a: list[int], b: list[int], is_random_next: bool) -> None:
    tokens.append(cls)
    tokens.extend(a)
    tokens.append(sep)
    len_as.append(len(a) + 2)
    if b:
      tokens.extend(b)
      tokens.append(sep)
      lengths.append(len(a) + len(b) + 3)
    else:
      lengths.append(len(a) + 2)
    labels.append(int(is_random_next))

  truncated = 0
  passes = opts.dupe_factor if unit.split == "train" else 1
  for dupe in range(passes):
    if opts.nsp:
      rng = _unit_rng(opts.seed, unit.split, dupe, unit.index)
      for index in range(len(docs)):
        _nsp_pairs(docs, index, opts.max_seq_length, opts.short_seq_prob, rng, emit)
    else:
      truncated += _packed(docs, opts.max_seq_length, opts.packing == "full_sentences", sep, emit)
  dtype = records.token_dtype(tok.vocab_size)
  return dict(
    split=unit.split,
    tokens=np.asarray(tokens, dtype=dtype),
    lengths=np.asarray(lengths, dtype=np.int64),
    len_a=np.asarray(len_as, dtype=np.int64),
    labels=np.asarray(labels, dtype=np.uint8),
    documents=len(docs),
    sentences=sum(len(d) for d in docs),
    sentences_without_tokens=no_tokens,
    truncated_sentences=truncated,
  )


class _InProcess:
  """The apply_async interface of a Pool, run in this process (--num_workers=1)."""

  def __init__(self, opts: Options):
    _init_worker(opts)

  def apply_async(self, fn, args):
    result = fn(*args)
    return type("Done", (), {"get": lambda self, timeout=None: result})()

  def close(self):
    pass

  def terminate(self):
    pass

  def join(self):
    pass


# ----------------------------------------------------------------------------- writing


class _ShardWriter:
  """Writes one split's records into numbered shards under a temporary directory."""

  def __init__(self, directory: str, split: str, records_per_shard: int):
    from array_record.python.array_record_module import ArrayRecordWriter

    self._writer_cls = ArrayRecordWriter
    self.directory, self.split, self.per_shard = directory, split, records_per_shard
    self.paths: list[str] = []
    self._writer = None
    self._in_shard = 0
    self.num_records = 0
    self.num_tokens = 0

  def write(self, record: bytes) -> None:
    if self._writer is None or self._in_shard >= self.per_shard:
      self._close_shard()
      path = os.path.join(self.directory, f"{self.split}-{len(self.paths):05d}.partial")
      self.paths.append(path)
      self._writer = self._writer_cls(path, records.ARRAY_RECORD_OPTIONS)
      self._in_shard = 0
    self._writer.write(record)
    self._in_shard += 1
    self.num_records += 1

  def _close_shard(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def finish(self) -> list[tuple[str, str]]:
    """Closes; returns (temporary path, final file name) pairs."""
    self._close_shard()
    n = len(self.paths)
    return [(p, f"{self.split}-{i:05d}-of-{n:05d}.array_record") for i, p in enumerate(self.paths)]


class _Masker:
  """--write_masks: bert_jax.masking.mask_batch with rng example_key(seed, example_id)."""

  BATCH = 1024

  def __init__(self, tok, opts: Options):
    # A host-side tool: never grab an accelerator (or print libtpu's probing errors).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from bert_jax import masking

    self.cfg = masking.MaskingConfig(
      max_predictions=opts.max_predictions_per_seq,
      masked_lm_prob=opts.masked_lm_prob,
      whole_word=opts.whole_word_mask,
    )
    tables = masking.tables_from_tokenizer(tok)
    seed, cfg = opts.seed, self.cfg
    self.mask_id = int(tok.mask_id)
    self.length = opts.max_seq_length
    self.fn = jax.jit(lambda i, x, m: masking.mask_batch(seed, i, None, x, m, tables, cfg))

  def __call__(self, first_id: int, tokens_list: list[np.ndarray]):
    """Yields (masked_ids, positions, original_ids) per sequence."""
    for start in range(0, len(tokens_list), self.BATCH):
      part = tokens_list[start : start + self.BATCH]
      ids_BL = np.zeros((self.BATCH, self.length), np.int32)
      mask_BL = np.zeros((self.BATCH, self.length), np.int32)
      for r, t in enumerate(part):
        ids_BL[r, : len(t)] = t
        mask_BL[r, : len(t)] = 1
      eid_B = (first_id + start + np.arange(self.BATCH)).astype(np.int32)
      out = {k: np.asarray(v) for k, v in self.fn(eid_B, ids_BL, mask_BL).items()}
      for r, t in enumerate(part):
        m = int(out["masked_lm_weights"][r].sum())
        yield (
          out["input_ids"][r, : len(t)],
          out["masked_lm_positions"][r, :m],
          out["masked_lm_ids"][r, :m],
        )


# ----------------------------------------------------------------------------- driver


def _check_output_dir(output_dir: str, overwrite: bool) -> list[str]:
  """Refuses a directory holding a dataset (unless overwrite); returns the old dataset paths."""
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ValueError(f"--output_dir={output_dir} exists and is not a directory")
  if not os.path.isdir(output_dir):
    return []
  old = []
  for name in sorted(os.listdir(output_dir)):
    is_shard = name.endswith(".array_record") and name.split("-")[0] in _SPLIT_CODE
    if name in ("metadata.json", "tokenizer") or is_shard:
      old.append(os.path.join(output_dir, name))
  if old and not overwrite:
    raise ValueError(
      f"--output_dir={output_dir} already holds a dataset ({os.path.basename(old[0])}); "
      "pass --overwrite to replace it"
    )
  return old


def build(
  input: str | None = None,
  output_dir: str = "",
  *,
  vocab: str | None = None,
  tfds_name: str | None = None,
  tfds_data_dir: str | None = None,
  tfds_split: str = "train",
  tfds_text_key: str = "text",
  max_seq_length: int = 128,
  max_predictions_per_seq: int = 20,
  masked_lm_prob: float = 0.15,
  short_seq_prob: float = 0.1,
  dupe_factor: int = 1,
  seed: int = 12345,
  nsp: bool = True,
  packing: str = "full_sentences",
  eval_fraction: float = 0.01,
  write_masks: bool = False,
  whole_word_mask: bool = False,
  num_workers: int | None = None,
  records_per_shard: int = 100_000,
  overwrite: bool = False,
  chunk_chars: int = CHUNK_CHARS,
  progress: bool = True,
) -> dict[str, Any]:
  """Builds a pretraining dataset in output_dir; returns the summary (also in metadata.json)."""
  from bert_jax.tokenizer import default_vocab_path, load_tokenizer

  t0 = time.time()
  if not output_dir:
    raise ValueError("--output_dir is required")
  if (input is None) == (tfds_name is None):
    raise ValueError("give exactly one of --input and --tfds_name")
  if records_per_shard < 1:
    raise ValueError(f"--records_per_shard must be >= 1, got {records_per_shard}")
  opts = Options(
    vocab=os.path.abspath(vocab) if vocab else default_vocab_path(),
    max_seq_length=max_seq_length,
    max_predictions_per_seq=max_predictions_per_seq,
    masked_lm_prob=masked_lm_prob,
    short_seq_prob=short_seq_prob,
    dupe_factor=dupe_factor,
    seed=seed,
    nsp=nsp,
    packing=packing,
    eval_fraction=eval_fraction,
    write_masks=write_masks,
    whole_word_mask=whole_word_mask,
  )
  opts.validate()
  if not os.path.exists(opts.vocab):
    raise FileNotFoundError(f"--vocab: {opts.vocab} does not exist")
  old_paths = _check_output_dir(output_dir, overwrite)
  tok = load_tokenizer(opts.vocab)
  token_dtype = records.token_dtype(tok.vocab_size)
  if input is not None:
    reader = _Reader(expand_inputs(input))
    documents = reader.documents()
    est_chars = estimate_chars(reader.files)
  else:
    reader = _Reader([])
    documents, est_chars = _tfds_documents(tfds_name, tfds_data_dir, tfds_split, tfds_text_key)
  if num_workers is None:
    num_workers = os.cpu_count() or 1
  masker = _Masker(tok, opts) if write_masks else None

  os.makedirs(output_dir, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".create_data-", dir=output_dir)
  writers = {s: _ShardWriter(tmp, s, records_per_shard) for s in _SPLIT_CODE}
  stats = collections.Counter()
  mask_kinds = collections.Counter()
  next_id = 0
  pool = None
  bar = _progress_bar(0, False)
  try:
    if num_workers <= 1:
      pool = _InProcess(opts)
    else:
      ctx = multiprocessing.get_context("spawn")
      pool = ctx.Pool(num_workers, initializer=_init_worker, initargs=(opts,))
    pending: collections.deque = collections.deque()
    max_in_flight = max(2, num_workers + 1)  # bounds memory: a few chunks at a time

    def drain_one():
      nonlocal next_id
      result = pending.popleft().get()
      next_id = _write_result(result, writers, next_id, masker, opts, stats, mask_kinds)
      bar.update(stats["documents"], stats)

    scatter = _Scatter(tmp, est_chars, eval_fraction, chunk_chars, seed)
    bar = _progress_bar(reader.total_bytes, progress, "reading", "B")
    scatter.scatter(documents, lambda: bar.update(reader.position(), stats))
    bar.close()
    bar = _progress_bar(sum(scatter.documents.values()), progress, "sequences", "doc")
    for unit in itertools.chain(scatter.units("train"), scatter.units("eval")):
      if len(pending) >= max_in_flight:
        drain_one()
      pending.append(pool.apply_async(_process_unit, (unit,)))
      stats[f"{unit.split}_chunks"] += 1
    while pending:
      drain_one()
    pool.close()
    pool.join()
    bar.close()
    splits = {}
    moves = []
    for split, w in writers.items():
      pairs = w.finish()
      moves += pairs
      splits[split] = {
        "files": [name for _, name in pairs],
        "num_sequences": w.num_records,
        "num_tokens": int(stats[f"{split}_tokens"]),
      }
    if splits["train"]["num_sequences"] == 0:
      raise ValueError(f"--input={input or tfds_name}: no sequences (no usable text)")
    summary = _summary(stats, mask_kinds, reader, opts, splits, time.time() - t0, num_workers)
    metadata = {
      "format_version": records.FORMAT_VERSION,
      "max_seq_length": opts.max_seq_length,
      "nsp": opts.nsp,
      "packing": opts.layout,
      "dupe_factor": opts.dupe_factor,
      "seed": opts.seed,
      "short_seq_prob": opts.short_seq_prob,
      "eval_fraction": opts.eval_fraction,
      "max_predictions_per_seq": opts.max_predictions_per_seq,
      "masked_lm_prob": opts.masked_lm_prob,
      "token_dtype": token_dtype.name,
      "tokenizer": {
        "kind": tok.kind,
        "vocab_size": int(tok.vocab_size),
        "fingerprint": tok.fingerprint,
        "pad_id": int(tok.pad_id),
        "cls_id": int(tok.cls_id),
        "sep_id": int(tok.sep_id),
        "mask_id": int(tok.mask_id),
        "unk_id": int(tok.unk_id),
      },
      "masking": (
        dict(dataclasses.asdict(masker.cfg), seed=opts.seed) if masker is not None else None
      ),
      "splits": splits,
      "stats": summary["stats"],
      "skipped": summary["skipped"],
      "source": {"input": input, "tfds_name": tfds_name, "vocab": opts.vocab},
    }
    tok.save(os.path.join(tmp, "tokenizer"))
    with open(os.path.join(tmp, "metadata.json"), "w") as f:
      json.dump(metadata, f, indent=1)
    # Commit: replace the old dataset (only its own files), metadata.json last.
    for path in old_paths:
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    for path, name in moves:
      os.replace(path, os.path.join(output_dir, name))
    os.replace(os.path.join(tmp, "tokenizer"), os.path.join(output_dir, "tokenizer"))
    os.replace(os.path.join(tmp, "metadata.json"), os.path.join(output_dir, "metadata.json"))
  except BaseException:
    if pool is not None:
      pool.terminate()
    bar.close()
    raise
  finally:
    for w in writers.values():
      w._close_shard()
    shutil.rmtree(tmp, ignore_errors=True)
  summary["output_dir"] = output_dir
  return summary


def _write_result(result, writers, next_id, masker, opts, stats, mask_kinds) -> int:
  from bert_jax import masking  # the masked-count rule; jax only once results are written

  split = result["split"]
  writer = writers[split]
  tokens, lengths, len_a, labels = (result[k] for k in ("tokens", "lengths", "len_a", "labels"))
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  seqs = [tokens[offsets[i] : offsets[i + 1]] for i in range(len(lengths))]
  masks = masker(next_id, seqs) if masker is not None else None
  for i, seq in enumerate(seqs):
    if masks is None:
      writer.write(records.encode(next_id, labels[i], len_a[i], seq))
    else:
      masked, positions, original = next(masks)
      masked = masked.astype(seq.dtype)
      writer.write(records.encode(next_id, labels[i], len_a[i], seq, positions, original, masked))
      stats["masked_positions"] += len(positions)
      replaced = masked[positions]
      is_mask = replaced == masker.mask_id
      mask_kinds["mask"] += int(is_mask.sum())
      mask_kinds["same"] += int((replaced == original).sum())
      mask_kinds["random"] += int((~is_mask & (replaced != original)).sum())
    next_id += 1
  stats[f"{split}_tokens"] += int(lengths.sum())
  stats["sequences"] += len(lengths)
  stats["tokens"] += int(lengths.sum())
  stats["is_next"] += int((labels == 0).sum())
  stats["short_128"] += int((lengths < 128).sum())
  stats["short_64"] += int((lengths < 64).sum())
  stats["below_max"] += int((lengths < opts.max_seq_length).sum())
  expected = masking.num_to_predict(lengths, opts.max_predictions_per_seq, opts.masked_lm_prob)
  stats["expected_masked_positions"] += int(expected.sum())
  for key in ("documents", "sentences", "sentences_without_tokens", "truncated_sentences"):
    stats[key] += result[key]
  stats[f"{split}_documents"] += result["documents"]
  return next_id


def _summary(stats, mask_kinds, reader, opts, splits, seconds, num_workers) -> dict[str, Any]:
  n = max(stats["sequences"], 1)
  out = {
    "documents": stats["documents"],
    "train_documents": stats["train_documents"],
    "eval_documents": stats["eval_documents"],
    "sentences": stats["sentences"],
    "sequences": stats["sequences"],
    "tokens": stats["tokens"],
    "nsp_is_next_frac": stats["is_next"] / n if opts.nsp else None,
    "short_128_frac": stats["short_128"] / n,
    "short_64_frac": stats["short_64"] / n,
    "below_max_frac": stats["below_max"] / n,
    "mean_tokens": stats["tokens"] / n,
    # What masking will select per sequence (same count rule as the original and
    # bert_jax.masking); the actual mean when --write_masks.
    "mean_masked_positions": (
      stats["masked_positions"] if opts.write_masks else stats["expected_masked_positions"]
    )
    / n,
    "pseudo_document_splits": reader.pseudo_document_splits,
    "truncated_sentences": stats["truncated_sentences"],
  }
  total_masked = sum(mask_kinds.values())
  if total_masked:
    out["masked_input_fracs"] = {k: v / total_masked for k, v in sorted(mask_kinds.items())}
  skipped = dict(reader.skipped)
  if stats["sentences_without_tokens"]:
    skipped["sentences_without_tokens"] = stats["sentences_without_tokens"]
  return {
    "stats": out,
    "skipped": skipped,
    "splits": {s: {k: v for k, v in d.items() if k != "files"} for s, d in splits.items()},
    "seconds": round(seconds, 2),
    "num_workers": num_workers,
  }


class _progress_bar:  # noqa: N801 -- used like a function
  """tqdm over input bytes on stderr when available and wanted; else a line every 10 s."""

  def __init__(self, total: int, enabled: bool, desc: str = "", unit: str = "it"):
    self.enabled, self.total, self.last, self.t0 = enabled, total, 0, time.time()
    self.desc = desc
    self._last_print = self.t0
    self.bar = None
    if enabled:
      try:
        from tqdm import tqdm

        self.bar = tqdm(total=total or None, unit=unit, unit_scale=True, desc=desc, file=sys.stderr)
      except ImportError:
        pass

  def update(self, position: int, stats) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.update(max(0, position - self.last))
      self.bar.set_postfix(sequences=stats["sequences"], refresh=False)
    elif time.time() - self._last_print > 10:
      self._last_print = time.time()
      print(
        f"create_data: {self.desc} {position / max(self.total, 1):.0%}, "
        f"{stats['sequences']} sequences",
        file=sys.stderr,
      )
    self.last = position

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None


def format_summary(summary: dict[str, Any]) -> str:
  s = summary["stats"]
  lines = [
    f"documents {s['documents']} (train {s['train_documents']}, eval {s['eval_documents']}), "
    f"sentences {s['sentences']}",
    f"sequences {s['sequences']} (train {summary['splits']['train']['num_sequences']}, "
    f"eval {summary['splits']['eval']['num_sequences']}), tokens {s['tokens']} "
    f"(mean {s['mean_tokens']:.1f})",
    f"shorter than 128: {s['short_128_frac']:.1%}, than 64: {s['short_64_frac']:.1%}",
    f"mean masked positions {s['mean_masked_positions']:.2f}",
  ]
  if s["nsp_is_next_frac"] is not None:
    lines.append(f"NSP is-next {s['nsp_is_next_frac']:.1%}")
  if "masked_input_fracs" in s:
    f = s["masked_input_fracs"]
    lines.append(
      f"masked inputs: [MASK] {f.get('mask', 0):.1%}, random {f.get('random', 0):.1%}, "
      f"kept {f.get('same', 0):.1%}"
    )
  if s["pseudo_document_splits"]:
    lines.append(f"documents split for size: {s['pseudo_document_splits']}")
  skipped = summary["skipped"]
  lines.append(
    "skipped: " + (", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "nothing")
  )
  lines.append(f"{summary['seconds']:.1f} s with {summary['num_workers']} workers")
  return "\n".join(lines)
