"""grain input pipeline over the ArrayRecord shards written by `bert_jax.create_data`.

The record format is defined in `bert_jax.data.records`.

Order: the global example stream is the dataset shuffled with seed `seed + epoch` in each epoch
(grain's index shuffle), so position g holds epoch g // num_records. A global batch is a
contiguous block of global_batch_size positions; process p of P takes its p-th contiguous
sub-block, so the global batch is the same example sequence for any process count, processes
stay in lockstep and never overlap. `epoch` is returned per
example. The iterator is a grain DatasetIterator: get_state()/set_state() (or orbax via
grain.checkpoint.CheckpointSave/Restore) resume exactly.

Eval (repeat=False): the dataset is padded to a whole number of global batches with padding
examples (input_mask all 0, example_id -1), never dropped, so every process yields the same
number of batches and every real example is seen exactly once.
"""

from __future__ import annotations

import bisect
import json
import os
from typing import Any

import grain
import numpy as np

from bert_jax.data import records

_REQUIRED = ("format_version", "max_seq_length", "nsp", "token_dtype", "tokenizer", "splits")


def read_metadata(data_dir: str) -> dict[str, Any]:
  """metadata.json of a create_data output; a clear one-line error if missing or foreign."""
  path = os.path.join(data_dir, "metadata.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} not found: not a bert_jax.create_data output directory")
  try:
    with open(path) as f:
      meta = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} is corrupt: {e}") from e
  if not isinstance(meta, dict) or any(k not in meta for k in _REQUIRED):
    missing = [k for k in _REQUIRED if not isinstance(meta, dict) or k not in meta]
    raise ValueError(f"{path} is not bert_jax pretraining metadata (missing {', '.join(missing)})")
  if meta["format_version"] != records.FORMAT_VERSION:
    raise ValueError(
      f"{path}: format_version {meta['format_version']} is not supported "
      f"(want {records.FORMAT_VERSION})"
    )
  if meta["token_dtype"] not in records.TOKEN_DTYPES:
    raise ValueError(f"{path}: unknown token_dtype {meta['token_dtype']!r}")
  return meta


def check_vocab(metadata: dict[str, Any], tokenizer_or_vocab_size: Any) -> None:
  """Raises if the data was tokenized with another vocabulary than the model/tokenizer uses."""
  meta_tok = metadata["tokenizer"]
  if isinstance(tokenizer_or_vocab_size, int | np.integer):
    if int(tokenizer_or_vocab_size) != meta_tok["vocab_size"]:
      raise ValueError(
        f"vocab mismatch: the data has vocab_size {meta_tok['vocab_size']}, the model "
        f"{int(tokenizer_or_vocab_size)}"
      )
    return
  tok = tokenizer_or_vocab_size
  if tok.vocab_size != meta_tok["vocab_size"] or tok.fingerprint != meta_tok["fingerprint"]:
    raise ValueError(
      f"vocab mismatch: the data was tokenized with {meta_tok['kind']} vocab_size "
      f"{meta_tok['vocab_size']} fingerprint {meta_tok['fingerprint'][:12]}, the tokenizer is "
      f"{tok.kind} vocab_size {tok.vocab_size} fingerprint {tok.fingerprint[:12]}"
    )


def split_files(data_dir: str, split: str, metadata: dict[str, Any] | None = None) -> list[str]:
  metadata = metadata or read_metadata(data_dir)
  if split not in metadata["splits"]:
    raise ValueError(f"{data_dir}: no split {split!r} (has {', '.join(metadata['splits'])})")
  files = [os.path.join(data_dir, f) for f in metadata["splits"][split]["files"]]
  for f in files:
    if not os.path.isfile(f):
      raise FileNotFoundError(f"{f} is listed in {data_dir}/metadata.json but missing")
  # More than the record count: each shard is the one the build that wrote metadata.json wrote
  # (older builds recorded no fingerprints).
  for f, want in zip(files, metadata["splits"][split].get("fingerprints") or [], strict=False):
    if _fingerprint(f) != want:
      raise ValueError(
        f"{f} is not the shard {data_dir}/metadata.json describes (its size or content "
        "differs: another build's file, or one changed since): rebuild the dataset with python "
        "-m bert_jax.create_data"
      )
  return files


_fingerprints: dict[tuple, str] = {}


def _fingerprint(path: str) -> str:
  """records.shard_fingerprint, once per version of the file (size, mtime, inode)."""
  from bert_jax.data.records import shard_fingerprint

  st = os.stat(path)
  key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
  if key not in _fingerprints:
    _fingerprints[key] = shard_fingerprint(path)
  return _fingerprints[key]


class RecordReader:
  """Random access to the records of one split, decoded into padded numpy examples.

  Picklable (grain's worker processes rebuild the ArrayRecord readers lazily).
  """

  def __init__(self, files: list[str], metadata: dict[str, Any]):
    self.files = list(files)
    self.length = int(metadata["max_seq_length"])
    self.dtype = np.dtype(metadata["token_dtype"]).newbyteorder("<")
    masking = metadata.get("masking")
    self.num_predictions = int(masking["max_predictions"]) if masking else 0
    # train.validate makes the model's vocab_size equal to this one.
    self.vocab_size = int(metadata["tokenizer"]["vocab_size"])
    self._sizes: list[int] | None = None
    self._sources = None

  def _open(self):
    if self._sources is None:
      sources, sizes = [], []
      for f in self.files:
        try:
          src = grain.sources.ArrayRecordDataSource([f])
          sizes.append(len(src))
        except Exception as e:  # noqa: BLE001 -- the C++ reader raises bare RuntimeErrors
          raise ValueError(f"{f}: not a readable ArrayRecord file ({e})") from e
        sources.append(src)
      self._sources = sources
      self._starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
      self._sizes = sizes
    return self._sources

  def __len__(self) -> int:
    self._open()
    return self._starts[-1]

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_sources"] = None
    return state

  def padding_example(self) -> dict[str, np.ndarray]:
    ex = {
      "input_ids": np.zeros(self.length, np.int32),
      "segment_ids": np.zeros(self.length, np.int32),
      "input_mask": np.zeros(self.length, np.int32),
      "next_sentence_label": np.int32(0),
      "example_id": np.int32(-1),
      "epoch": np.int32(0),
    }
    if self.num_predictions:
      ex["masked_lm_positions"] = np.zeros(self.num_predictions, np.int32)
      ex["masked_lm_ids"] = np.zeros(self.num_predictions, np.int32)
      ex["masked_lm_weights"] = np.zeros(self.num_predictions, np.float32)
    return ex

  def read(self, index: int) -> dict[str, np.ndarray]:
    sources = self._open()
    shard = bisect.bisect_right(self._starts, index) - 1
    try:
      record = sources[shard][index - self._starts[shard]]
    except Exception as e:  # noqa: BLE001
      raise ValueError(f"{self.files[shard]}: cannot read record {index}: {e}") from e
    try:
      return self.decode(record)
    except ValueError as e:
      raise ValueError(
        f"{self.files[shard]}: corrupt record {index - self._starts[shard]}: {e}"
      ) from e

  def decode(self, record: bytes) -> dict[str, np.ndarray]:
    r = records.decode(record, self.dtype)
    n, m = len(r.tokens), 0 if r.masked_positions is None else len(r.masked_positions)
    if n > self.length:
      raise ValueError(f"inconsistent record: num_tokens {n} > max_seq_length {self.length}")
    if m > self.num_predictions:
      raise ValueError(f"{m} masked positions but the metadata allows {self.num_predictions}")
    inputs = r.tokens if not m else r.masked_tokens
    for name, ids in (("token", inputs), ("label", r.masked_ids)):
      # One vectorised max per array (token dtypes are unsigned: no id is negative). An id
      # outside the embedding table would otherwise surface only as a NaN loss, or not at all
      # (JAX clamps out-of-range gathers).
      if ids is not None and ids.max() >= self.vocab_size:
        raise ValueError(f"{name} id {ids.max()} outside the vocabulary [0, {self.vocab_size})")
    ex = self.padding_example()
    ex["input_ids"][:n] = inputs
    ex["segment_ids"][r.len_a : n] = 1
    ex["input_mask"][:n] = 1
    ex["next_sentence_label"] = np.int32(r.next_sentence_label)
    ex["example_id"] = np.int32(r.example_id)
    if m:
      ex["masked_lm_positions"][:m] = r.masked_positions
      ex["masked_lm_ids"][:m] = r.masked_ids
      ex["masked_lm_weights"][:m] = 1.0
    return ex


class _ReadExample:
  """(global position, record index or -1 for padding) -> example with its epoch."""

  def __init__(self, reader: RecordReader, num_records: int):
    self.reader, self.num_records = reader, num_records

  def __call__(self, item: tuple[int, int]) -> dict[str, np.ndarray]:
    position, index = item
    if index < 0 or index >= self.num_records:
      return self.reader.padding_example()
    ex = self.reader.read(index)
    ex["epoch"] = np.int32(position // self.num_records)
    return ex


def _padding_index(_: int) -> int:
  return -1


def _with_position(position: int, index: int) -> tuple[int, int]:
  return position, index


class _ProcessBlocks(grain.MapDataset):
  """Process p's share of each global batch: its contiguous block [p*h, (p+1)*h).

  The global batch is then the same sequence of examples whatever the process count (one
  process with 8 devices == two with 4), which keeps per-position randomness such as dropout
  identical across host layouts.
  """

  def __init__(self, parent: grain.MapDataset, global_batch: int, index: int, count: int):
    super().__init__(parent)
    self._global = global_batch
    self._host = global_batch // count
    self._offset = index * self._host

  def __len__(self) -> int:
    return len(self._parent) // self._global * self._host

  def __getitem__(self, j):
    if isinstance(j, slice):
      return self.slice(j)
    batch, k = divmod(j, self._host)
    return self._parent[batch * self._global + self._offset + k]

  def __str__(self) -> str:
    return f"_ProcessBlocks(global={self._global}, host={self._host}, offset={self._offset})"


def make_dataset(
  data_dir: str,
  split: str,
  *,
  global_batch_size: int,
  seed: int,
  shuffle: bool = True,
  repeat: bool = True,
  process_index: int | None = None,
  process_count: int | None = None,
  worker_count: int = 0,
  num_threads: int = 16,
) -> grain.IterDataset:
  """Host batches (numpy dicts of global_batch_size // process_count examples) of one split."""
  if process_index is None or process_count is None:
    import jax

    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if global_batch_size < 1 or global_batch_size % process_count:
    raise ValueError(
      f"global batch size {global_batch_size} is not a positive multiple of the process count "
      f"{process_count}"
    )
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  metadata = read_metadata(data_dir)
  reader = RecordReader(split_files(data_dir, split, metadata), metadata)
  num_records = len(reader)
  if num_records != metadata["splits"][split]["num_sequences"]:
    raise ValueError(
      f"{data_dir}: split {split} has {num_records} records but metadata.json says "
      f"{metadata['splits'][split]['num_sequences']}"
    )
  if num_records == 0:
    raise ValueError(f"{data_dir}: split {split!r} is empty")
  host_batch = global_batch_size // process_count

  ds = grain.MapDataset.range(num_records)
  if shuffle:
    ds = ds.shuffle(seed=seed % 2**32)  # reseeded per epoch (seed + epoch) by grain
  if repeat:
    ds = ds.repeat(None)
  else:
    # Pad to whole global batches: every process yields the same number of batches.
    padded = -(-num_records // global_batch_size) * global_batch_size
    if padded > num_records:
      pad = grain.MapDataset.range(padded - num_records).map(_padding_index)
      ds = grain.MapDataset.concatenate([ds, pad])
  ds = ds.map_with_index(_with_position)
  ds = _ProcessBlocks(ds, global_batch_size, process_index, process_count)
  ds = ds.map(_ReadExample(reader, num_records))
  ds = ds.batch(host_batch, drop_remainder=True)
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=64))
  if worker_count > 0:
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
  return it
