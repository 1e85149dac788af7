"""The golden HuggingFace fixture tests/fixtures/hf/roundtrip/ (tests/fixtures/make_hf_fixtures.py)
and the checks against it, for the loader's and the tokenizer files' tests (test_interop_loader,
test_tokenizers_files and the end-to-end half)."""

import importlib.util
import json
import pathlib

import numpy as np
from safetensors.numpy import load_file

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "hf" / "roundtrip"
_spec = importlib.util.spec_from_file_location(
  "hf_fixtures", REPO / "tests/fixtures/make_hf_fixtures.py"
)
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)
LIVE = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
HF_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json")


def _one_line(excinfo, *needles):
  msg = str(excinfo.value)
  assert "\n" not in msg, msg
  for needle in needles:
    assert needle in msg, (needle, msg)


def _reference():
  ref = json.loads((FIXTURE / "hf_reference.json").read_text())
  return ref, load_file(str(FIXTURE / "hf_hidden.safetensors"))


def _check_fill_mask(ours, theirs, atol):
  """Per text, per [MASK]: the same top-5 token ids, probabilities within atol."""
  assert len(ours) == len(theirs)
  for text_ours, text_theirs in zip(ours, theirs, strict=True):
    assert len(text_ours) == len(text_theirs)
    for top_ours, top_theirs in zip(text_ours, text_theirs, strict=True):
      assert [i for i, _ in top_ours] == [i for i, _ in top_theirs]
      np.testing.assert_allclose([p for _, p in top_ours], [p for _, p in top_theirs], atol=atol)


def _fill_mask_ids(m):
  """bert_jax's fill_mask with token ids (as transformers' pipeline reports them)."""
  out = m.fill_mask(list(mk.FILL_MASK_TEXTS))
  return [[[(m.tokenizer.token_to_id(t), p) for t, p in per] for per in text] for text in out]


def _check_hidden(m, hidden, atol):
  emb = m.embed(list(mk.EMBED_TEXTS), layers=tuple(range(m.config.num_layers + 1)))
  for i, h in enumerate(emb.hidden):
    np.testing.assert_allclose(h, hidden[f"text_{i}"], atol=atol, rtol=0)


def _same_files(directory, files):
  """The tokenizer files in `directory` hold what `files` holds (JSON compared parsed)."""
  for name in HF_TOKENIZER_FILES:
    got, want = (directory / name).read_bytes(), files[name]
    if name.endswith(".json"):
      got, want = json.loads(got), json.loads(want)
    assert got == want, name


def _digest(tok):
  return mk.ids_digest(tok.encode)
