"""The pretraining record format: what `create_data` writes and the input pipeline reads.

One ArrayRecord record per sequence, little-endian, no pickle or protobuf:

  header "<qBHHH"  example_id (int64), next_sentence_label (uint8, 0 = B is the real
                   continuation), len_a (tokens of [CLS] A [SEP]), num_tokens (incl. the
                   [CLS]/[SEP]s), num_masked (uint16 each)
  num_tokens token ids in the dataset's token dtype (metadata.json "token_dtype")
  if num_masked:   the masked positions (uint16), their original ids (token dtype) and the
                   masked input ids (num_tokens, token dtype)

metadata.json carries `format_version` = FORMAT_VERSION; a reader refuses any other version.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import NamedTuple

import numpy as np

FORMAT_VERSION = 1
HEADER = struct.Struct("<qBHHH")
ARRAY_RECORD_OPTIONS = "group_size:1"  # random access per record, which grain needs
TOKEN_DTYPES = ("uint16", "uint32")


class Record(NamedTuple):
  """One decoded record; the mask fields are None when the record stores no mask."""

  example_id: int
  next_sentence_label: int
  len_a: int
  tokens: np.ndarray
  masked_positions: np.ndarray | None = None
  masked_ids: np.ndarray | None = None  # the original ids at masked_positions
  masked_tokens: np.ndarray | None = None  # the whole sequence as the model sees it


def token_dtype(vocab_size: int) -> np.dtype:
  """The narrowest token dtype that holds every id of a vocabulary."""
  return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def encode(
  example_id: int,
  next_sentence_label: int,
  len_a: int,
  tokens: np.ndarray,
  masked_positions: np.ndarray | None = None,
  masked_ids: np.ndarray | None = None,
  masked_tokens: np.ndarray | None = None,
) -> bytes:
  """A record's bytes; `tokens` already has the dataset's token dtype."""
  if masked_positions is None:
    return HEADER.pack(example_id, next_sentence_label, len_a, len(tokens), 0) + tokens.tobytes()
  return (
    HEADER.pack(example_id, next_sentence_label, len_a, len(tokens), len(masked_positions))
    + tokens.tobytes()
    + masked_positions.astype("<u2").tobytes()
    + masked_ids.astype(tokens.dtype).tobytes()
    + masked_tokens.astype(tokens.dtype).tobytes()
  )


def decode(record: bytes, dtype: np.dtype) -> Record:
  """Parses a record (arrays are read-only views of it); ValueError names what is wrong."""
  if len(record) < HEADER.size:
    raise ValueError(f"{len(record)} bytes is shorter than the header")
  example_id, label, len_a, n, m = HEADER.unpack_from(record)
  size = dtype.itemsize
  want = HEADER.size + n * size + (m * 2 + m * size + n * size if m else 0)
  if len(record) != want or len_a > n or label > 1 or n < 2:
    raise ValueError(
      f"inconsistent record (bytes {len(record)} want {want}, num_tokens {n}, len_a {len_a}, "
      f"label {label})"
    )
  offset = HEADER.size
  tokens = np.frombuffer(record, dtype, n, offset)
  if not m:
    return Record(example_id, label, len_a, tokens)
  offset += n * size
  positions = np.frombuffer(record, "<u2", m, offset)
  offset += 2 * m
  original = np.frombuffer(record, dtype, m, offset)
  offset += m * size
  return Record(
    example_id, label, len_a, tokens, positions, original, np.frombuffer(record, dtype, n, offset)
  )


FINGERPRINT_BYTES = 1 << 20


def shard_fingerprint(path: str) -> str:
  """`SIZE:HASH` of a written shard: its size and the sha256 of its first and last MiB, which
  tell one build's shard from another's without reading it whole (an ArrayRecord file ends in
  the index of its chunks). metadata.json lists them; readers check them
  (input_pipeline.split_files)."""
  size = os.path.getsize(path)
  h = hashlib.sha256()
  with open(path, "rb") as f:
    h.update(f.read(FINGERPRINT_BYTES))
    if size > FINGERPRINT_BYTES:
      f.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
      h.update(f.read(FINGERPRINT_BYTES))
  return f"{size}:{h.hexdigest()[:32]}"
