"""The end-to-end half of tests/unit/test_tokenizers_tokenizer.py (real processes; slow): see its
docstring."""

import hashlib

import pytest
from unit import test_tokenizers_tokenizer as unit_tokenizers_tokenizer
from unit.test_tokenizers_tokenizer import (
  _check_codepoint_blocks,
  _corpus_lines,
  _fixture,
  _ids_line,
)

# The unit half's fixtures, shared here (request.getfixturevalue reads them by name too).
uncased, cased = unit_tokenizers_tokenizer.uncased, unit_tokenizers_tokenizer.cased


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
