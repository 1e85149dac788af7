"""bert_jax.data.records: a record's bytes round-trip with and without a stored mask, the token
dtype, inconsistent bytes refused with what is wrong, and a shard's fingerprint."""

import hashlib

import numpy as np
import pytest

from bert_jax.data import records


def test_token_dtype_is_the_narrowest_that_holds_the_vocabulary():
  assert records.token_dtype(30522) == np.uint16
  assert records.token_dtype(65535) == np.uint16  # ids 0..65534
  assert records.token_dtype(65536) == np.uint32
  assert records.token_dtype(250_002) == np.uint32


@pytest.mark.parametrize("dtype", [np.dtype("<u2"), np.dtype("<u4")])
def test_encode_decode_round_trip(dtype):
  tokens = np.array([101, 7, 8, 102, 9, 102, 70_000 % 65536], dtype)
  raw = records.encode(12, 1, 4, tokens)
  assert len(raw) == records.HEADER.size + 7 * dtype.itemsize
  r = records.decode(raw, dtype)
  assert (r.example_id, r.next_sentence_label, r.len_a) == (12, 1, 4)
  np.testing.assert_array_equal(r.tokens, tokens)
  assert r.masked_positions is None and r.masked_ids is None and r.masked_tokens is None
  # With a mask: positions (uint16), the original ids there, the sequence as the model sees it.
  positions = np.array([1, 4], np.int64)
  masked = tokens.copy()
  masked[positions] = 103
  raw = records.encode(5, 0, 4, tokens, positions, tokens[positions], masked)
  # header, 7 tokens, 2 positions of 2 bytes, 2 original ids, 7 masked tokens
  assert len(raw) == records.HEADER.size + 7 * dtype.itemsize + 2 * 2 + (2 + 7) * dtype.itemsize
  r = records.decode(raw, dtype)
  assert (r.example_id, r.next_sentence_label) == (5, 0)
  np.testing.assert_array_equal(r.masked_positions, [1, 4])
  assert r.masked_positions.dtype == np.dtype("<u2")
  np.testing.assert_array_equal(r.masked_ids, [7, 9])
  np.testing.assert_array_equal(r.masked_tokens, masked)
  np.testing.assert_array_equal(r.tokens, tokens)
  assert not r.tokens.flags.writeable  # a view of the record's bytes


def test_inconsistent_records_are_refused_naming_what_is_wrong():
  tokens = np.array([101, 7, 102], np.uint16)
  raw = records.encode(0, 0, 2, tokens)
  with pytest.raises(ValueError, match="^3 bytes is shorter than the header$"):
    records.decode(raw[:3], np.dtype("<u2"))
  with pytest.raises(ValueError, match=r"^inconsistent record \(bytes 19 want 21, num_tokens 3"):
    records.decode(raw[:-2], np.dtype("<u2"))
  with pytest.raises(ValueError, match=r"want 27, num_tokens 3"):  # read as uint32
    records.decode(raw, np.dtype("<u4"))
  with pytest.raises(ValueError, match=r"len_a 4, label 0\)$"):
    records.decode(records.encode(0, 0, 4, tokens), np.dtype("<u2"))
  with pytest.raises(ValueError, match=r"label 2\)$"):
    records.decode(records.encode(0, 2, 1, tokens), np.dtype("<u2"))
  with pytest.raises(ValueError, match=r"num_tokens 1,"):
    records.decode(records.encode(0, 0, 1, tokens[:1]), np.dtype("<u2"))


def test_shard_fingerprint_reads_the_size_and_both_ends(tmp_path):
  mib = records.FINGERPRINT_BYTES
  small = tmp_path / "small"
  small.write_bytes(b"abc")
  assert records.shard_fingerprint(str(small)) == "3:" + hashlib.sha256(b"abc").hexdigest()[:32]
  data = bytearray(np.random.default_rng(0).integers(0, 256, 3 * mib, np.uint8).tobytes())
  big = tmp_path / "big"
  big.write_bytes(bytes(data))
  want = hashlib.sha256(bytes(data[:mib]) + bytes(data[-mib:])).hexdigest()[:32]
  fp = records.shard_fingerprint(str(big))
  assert fp == f"{3 * mib}:{want}"
  for where, changes in ((0, True), (mib + 5, False), (3 * mib - 1, True)):
    changed = bytearray(data)
    changed[where] ^= 1
    big.write_bytes(bytes(changed))
    assert (records.shard_fingerprint(str(big)) != fp) == changes, where
