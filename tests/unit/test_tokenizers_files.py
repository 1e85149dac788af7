"""bert_jax.tokenizers.files: the HuggingFace tokenizer files written for a tokenizer are the
fixture's, and read back as the same tokenizer (with no vocab.txt, or no tokenizer_config.json)."""

import shutil

from bert_jax.interop import loader
from bert_jax.tokenizers import files as tokenizer_files
from unit._hf_fixture import FIXTURE, _digest, _reference, _same_files


def test_exported_tokenizer_matches_transformers_fixture(tmp_path):
  """The fixture's tokenizer files are what tokenizer_files writes today, and transformers' ids on
  every corpus line (recorded) equal ours."""
  ref, _ = _reference()
  tok = tokenizer_files.load_hf_tokenizer(FIXTURE)
  _same_files(FIXTURE, tokenizer_files.hf_tokenizer_files(tok, loader.read_config(FIXTURE)[1]))
  assert ref["tokenizer_class"] == "BertTokenizerFast"
  assert not any(ref["loading_info"].values())
  assert _digest(tok) == ref["ids_digest"]
  # A dir with tokenizer.json but no vocab.txt gives the same tokenizer.
  shutil.copytree(FIXTURE, tmp_path / "no_vocab")
  (tmp_path / "no_vocab" / "vocab.txt").unlink()
  assert tokenizer_files.load_hf_tokenizer(tmp_path / "no_vocab").fingerprint == tok.fingerprint
  # Without tokenizer_config.json (Google's releases), casing follows the vocab's letters.
  google = tmp_path / "google"
  google.mkdir()
  shutil.copy(FIXTURE / "vocab.txt", google / "vocab.txt")
  assert tokenizer_files.load_hf_tokenizer(google).lowercase
  vocab = (google / "vocab.txt").read_text()
  (google / "vocab.txt").write_text(vocab.replace("\nalice\n", "\nAlice\n"))
  assert not tokenizer_files.load_hf_tokenizer(google).lowercase
