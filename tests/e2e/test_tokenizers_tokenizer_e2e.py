"""Tests for bert_jax.tokenizers.tokenizer, bert_jax.tokenizers.training and the
train_tokenizer CLI.

WordPiece parity with google-research/bert's FullTokenizer is checked against golden ids made by
tests/fixtures/make_tokenizer_fixtures.py (which ran the original code once; see its docstring).
"""

import gzip
import hashlib
import json
import pathlib

import pytest

from bert_jax.tokenizers import tokenizer as tokenizer_lib

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "tokenizer"


def _fixture(name):
  with open(FIXTURES / name, encoding="utf-8") as f:
    return json.load(f)


def _ids_line(ids) -> bytes:  # the digest format of tests/fixtures/make_tokenizer_fixtures.py
  return (" ".join(map(str, ids)) + "\n").encode()


def _corpus_lines(path):
  with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
    for line in f:
      if line.strip():
        yield line[:-1] if line.endswith("\n") else line


@pytest.fixture(scope="module")
def uncased():
  return tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())


@pytest.fixture(scope="module")
def cased():
  return tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path(), lowercase=False)


def _check_codepoint_blocks(tok, casing, starts):
  data = _fixture("codepoints.json")
  block = data["block"]
  assert len(data[casing]) == 0x110000 // block
  for start in starts:
    cps = [cp for cp in range(start, start + block) if not 0xD800 <= cp <= 0xDFFF]
    h = hashlib.sha256()
    for ids in tok.encode_batch([f"a{chr(cp)}b {chr(cp)}." for cp in cps]):
      h.update(_ids_line(ids))
    assert h.hexdigest() == data[casing][f"{start:06X}"], f"block U+{start:06X} ({casing})"


@pytest.mark.slow
@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_every_codepoint_matches_reference(casing, request):
  starts = range(0, 0x110000, _fixture("codepoints.json")["block"])
  _check_codepoint_blocks(request.getfixturevalue(casing), casing, starts)


@pytest.mark.slow
def test_whole_corpus_matches_reference(shared_data, uncased):
  ref = _fixture("corpus_digest.json")
  lines = list(_corpus_lines(shared_data / "corpus" / ref["corpus"]))
  assert len(lines) == ref["num_lines"] == 587649
  h, n_ids = hashlib.sha256(), 0
  for i in range(0, len(lines), 20000):
    for ids in uncased.encode_batch(lines[i : i + 20000]):
      h.update(_ids_line(ids))
      n_ids += len(ids)
  assert n_ids == ref["num_ids"]
  assert h.hexdigest() == ref["sha256"]


# --- WordPiece: interface -------------------------------------------------------------------
