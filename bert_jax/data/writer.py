"""The parallel, byte-deterministic half of create_data: documents -> shuffled chunks ->
sequences in worker processes -> ArrayRecord shards written in chunk order.

A first pass (`Scatter`) routes each document to train or eval and scatters it over random
bucket files of about a chunk each (an external shuffle); each bucket is then read and shuffled
in memory and chunks of ~CHUNK_CHARS of text are cut from them, so every chunk is a uniform
random sample of the corpus whatever its order and size. Each chunk is an independent work
unit (`process_unit`: bert_jax.data.sequences on it) whose random generator is seeded from (seed,
split, dupe pass, chunk index); the random "other document" for NSP comes from the same chunk.
Workers (spawned processes, `Workers`) run units; the parent writes results in chunk order and
numbers examples sequentially (`write_result`), so the output is byte-identical for any number of
workers, and at most a few chunks are in memory at once (the buckets take about the size of
the uncompressed text, in a temporary directory).

Held-out documents are chosen by a hash of their text (duplicates land in the same split); a
corpus that fits in one chunk gets at least MIN_EVAL_DOCS eval documents (at most a tenth of
its documents, and at least one). Eval documents are grouped into their own chunks and get a
single pass (no dupes).
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import multiprocessing
import multiprocessing.connection as mp_connection
import multiprocessing.resource_tracker
import os
import pickle
import random
import re
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np

from bert_jax.data import corpus, records, sequences
from bert_jax.runtime import files

CHUNK_CHARS = 4 << 20  # text per work unit
# Buckets of about a chunk each up to 16 GB of text (bigger corpora get bigger buckets, each
# still shuffled in memory); write buffers share a fixed budget.
MAX_BUCKETS = 4096
BUFFER_BUDGET_CHARS = 256 << 20
MIN_EVAL_DOCS = 3
SPLITS = ("train", "eval")


class WriteError(OSError):
  """Writing the dataset's files failed (a full disk, a quota, a file-size limit): `build`
  says so in one line naming the output directory, and removes what it wrote."""


# strerror text -> errno, to read ArrayRecord's RuntimeError ("write() failed: No space left on
# device; writing ...; at byte N") back as the OS error it is.
_ERRNOS = {os.strerror(n): n for n in sorted(errno.errorcode, reverse=True)}


def _write_error(error: Exception) -> WriteError:
  if isinstance(error, OSError):
    return WriteError(error.errno, error.strerror or str(error))
  m = re.search(r"failed: ([^;]+)", str(error))
  reason = m.group(1).strip() if m else " ".join(str(error).split())[:200]
  return WriteError(_ERRNOS.get(reason, errno.EIO), reason)


@dataclasses.dataclass
class Unit:
  """A work unit: chunk `index` of `split`, documents of sentences."""

  split: str
  index: int
  docs: list[list[str]]


class Scatter:
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
      try:
        # newline="\n" here and below: the text goes back exactly as corpus.read_lines split it.
        with open(
          self._path(*key), "a", encoding="utf-8", errors="surrogatepass", newline="\n"
        ) as f:
          f.write("".join(self.buffers[key]))
      except OSError as e:
        raise _write_error(e) from None
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
      eval_ids = set(sorted(range(n), key=lambda i: (corpus.doc_hash(first[i]), i))[:k])
    threshold = int(self.eval_fraction * 2**64)
    i = 0
    for source in (first, docs):
      for doc in source:
        if small:
          self._add("eval" if i in eval_ids else "train", doc)
        else:
          self._add("eval" if corpus.doc_hash(doc) < threshold else "train", doc)
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
    with open(path, encoding="utf-8", errors="surrogatepass", newline="\n") as f:
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

  def units(self, split: str) -> Iterator[Unit]:
    """Pass 2: chunks of ~chunk_chars of text from the shuffled buckets, one after another.

    A chunk spanning two buckets joins random subsets of two random samples: still random.
    """
    index = 0
    pending: list[list[str]] = []
    size = 0
    for bucket in range(self.num_buckets[split]):
      docs = self._read_bucket(split, bucket)
      sequences.seeded_rng(self.seed, "bucket", split, bucket).shuffle(docs)
      for doc in docs:
        pending.append(doc)
        size += sum(map(len, doc))
        if size >= self.chunk_chars:
          yield Unit(split, index, pending)
          index += 1
          pending, size = [], 0
    if pending:
      yield Unit(split, index, pending)


# ----------------------------------------------------------------------------- workers

_WORKER: dict[str, Any] = {}


def init_worker(opts: sequences.Options) -> None:
  """Worker start: the options and the tokenizer, loaded once per worker process."""
  from bert_jax.tokenizers.tokenizer import load_tokenizer

  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  _WORKER["opts"] = opts
  _WORKER["tok"] = load_tokenizer(opts.vocab)


def process_unit(unit: Unit) -> dict[str, Any]:
  """Tokenizes one chunk and builds its sequences (all dupe passes), in a worker."""
  return sequences.chunk_sequences(
    unit.split, unit.index, unit.docs, _WORKER["opts"], _WORKER["tok"]
  )


# The signals a worker leaves to its parent (see `Workers`).
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Failed:
  """A unit's exception, as a worker sends it back (the exception itself if it pickles)."""

  def __init__(self, error: BaseException):
    self.text = f"{type(error).__name__}: {error}"
    try:
      pickle.dumps(error)
      self.error: BaseException | None = error
    except Exception:  # noqa: BLE001 -- an exception that does not pickle: its text
      self.error = None

  def raise_(self) -> None:
    raise self.error if self.error is not None else RuntimeError(self.text)


def _worker_main(conn, opts: sequences.Options) -> None:
  """A worker: units in, results out, one at a time, until its pipe closes. It ignores the
  stop signals (it started with them blocked; blocked ignored signals are discarded): a Ctrl-C
  to the process group or a scheduler's SIGTERM to every process of a task is its parent's to
  act on, which then stops it."""
  for sig in _SIGNALS:
    signal.signal(sig, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
  init_worker(opts)
  while True:
    try:
      unit = conn.recv()
    except (EOFError, OSError):  # the parent closed the pipe (or is gone): done
      return
    try:
      result: Any = process_unit(unit)
    except Exception as e:  # noqa: BLE001 -- the parent raises it
      result = _Failed(e)
    try:
      conn.send(result)
    except OSError:
      return


class Workers:
  """`n` spawned worker processes running `process_unit`, each with a pipe of its own.

  Nothing is shared between processes but the pipes (no queue lock, no helper thread), so
  `stop` ends the workers at any moment without waiting on one: multiprocessing.Pool's
  terminate can hang on a lock a worker holds, and a Pool whose worker died waits forever.
  The workers start in a section a signal does not cut (`files.uninterrupted`, stop signals
  blocked: a worker half started when its parent gives up prints an `EOFError` traceback) and
  ignore the stop signals themselves (`_worker_main`). A worker that dies (the OOM killer) is
  an error naming its exit status.
  """

  def __init__(self, n: int, opts: sequences.Options):
    ctx = multiprocessing.get_context("spawn")
    self.procs: list[Any] = []
    self.conns: list[Any] = []
    # At exit, before multiprocessing's own clean-up (atexit runs the last registered first),
    # which would SIGTERM workers that ignore it and wait for them forever.
    atexit.register(self.stop, True)
    try:
      with files.uninterrupted():  # a signal meanwhile is raised at its end: caught below
        # Starting the resource tracker unblocks SIGINT and SIGTERM (its own hold while it
        # starts): first, so that the block below holds while the workers start.
        multiprocessing.resource_tracker.ensure_running()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
          for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, opts), daemon=True)
            self.procs.append(proc)
            self.conns.append(parent)
            proc.start()
            child.close()
        finally:
          signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a blocked signal lands here
    except BaseException:
      self.stop(kill=True)
      raise

  def imap(self, units: Iterator[Unit], window: int) -> Iterator[dict[str, Any]]:
    """The results of `units` in their order; at most `window` units sent and not yet yielded
    (memory: a few chunks at a time). A unit goes only to an idle worker, so a send never
    waits on a worker busy sending its own result."""
    units = iter(units)
    idle = list(range(len(self.procs)))[::-1]
    busy: dict[int, int] = {}  # worker -> index of its unit
    done: dict[int, Any] = {}  # index -> result, not yet yielded
    sent = out = 0
    exhausted = False
    while True:
      while idle and not exhausted and sent - out < window:
        unit = next(units, None)
        if unit is None:
          exhausted = True
          break
        w = idle.pop()
        self.conns[w].send(unit)
        busy[w] = sent
        sent += 1
      if out in done:
        result = done.pop(out)
        out += 1
        if isinstance(result, _Failed):
          result.raise_()
        yield result
        continue
      if exhausted and out == sent:
        return
      ready = mp_connection.wait([self.conns[w] for w in busy])
      for w in [w for w in busy if self.conns[w] in ready]:
        try:
          done[busy.pop(w)] = self.conns[w].recv()
        except (EOFError, OSError):
          self.procs[w].join(5)
          raise RuntimeError(
            f"a data worker (pid {self.procs[w].pid}) died (exit status "
            f"{self.procs[w].exitcode}): out of memory?"
          ) from None
        idle.append(w)

  def stop(self, kill: bool = False) -> None:
    """Ends the workers: done (`kill` False), each ends when its pipe closes; given up, each is
    SIGKILLed (they ignore the stop signals). Never waits on a worker that does not end."""
    atexit.unregister(self.stop)
    for conn in self.conns:
      conn.close()
    for proc in self.procs:
      if proc.pid is None:  # never started
        continue
      if kill:
        proc.kill()
      proc.join(None if kill else 60)
      if proc.exitcode is None:
        proc.kill()
        proc.join()
    self.procs, self.conns = [], []


class InProcess:
  """`Workers` run in this process (--num_workers=1)."""

  def __init__(self, opts: sequences.Options):
    init_worker(opts)

  def imap(self, units: Iterator[Unit], window: int) -> Iterator[dict[str, Any]]:
    del window
    return map(process_unit, units)

  def stop(self, kill: bool = False) -> None:
    pass


# ----------------------------------------------------------------------------- writing


class ShardWriter:
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
    try:
      if self._writer is None or self._in_shard >= self.per_shard:
        self.close()
        path = os.path.join(self.directory, f"{self.split}-{len(self.paths):05d}.partial")
        self.paths.append(path)
        self._writer = self._writer_cls(path, records.ARRAY_RECORD_OPTIONS)
        self._in_shard = 0
      self._writer.write(record)
    except (OSError, RuntimeError) as e:  # ArrayRecord reports a failed write as RuntimeError
      raise _write_error(e) from None
    self._in_shard += 1
    self.num_records += 1

  def close(self) -> None:
    if self._writer is not None:
      writer, self._writer = self._writer, None
      try:
        writer.close()
      except (OSError, RuntimeError) as e:
        raise _write_error(e) from None

  def abandon(self) -> None:
    """Closes after a failure, whose error is the one to report: the writer's own is dropped
    (ArrayRecord repeats a failed write's error at close)."""
    try:
      self.close()
    except WriteError:
      pass

  def finish(self) -> list[tuple[str, str]]:
    """Closes; returns (temporary path, final file name) pairs."""
    self.close()
    n = len(self.paths)
    return [(p, f"{self.split}-{i:05d}-of-{n:05d}.array_record") for i, p in enumerate(self.paths)]


class Masker:
  """--write_masks: bert_jax.masking.mask_batch with rng example_key(seed, example_id)."""

  BATCH = 1024

  def __init__(self, tok, opts: sequences.Options):
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


def write_result(result, writers, next_id, masker, opts, stats, mask_kinds) -> int:
  """Writes one unit's sequences (with their masks under --write_masks) as records numbered
  from `next_id`, adding to the counts; returns the next example id."""
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
  from bert_jax import masking  # the masked-count rule; jax only once results are written

  expected = masking.num_to_predict(lengths, opts.max_predictions_per_seq, opts.masked_lm_prob)
  stats["expected_masked_positions"] += int(expected.sum())
  for key in ("documents", "sentences", "sentences_without_tokens", "truncated_sentences"):
    stats[key] += result[key]
  stats[f"{split}_documents"] += result["documents"]
  return next_id
