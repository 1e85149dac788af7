"""Tests for bert_jax.tokenizers.tokenizer (training's are test_tokenizers_training.py, the
train_tokenizer command's test_train_tokenizer.py).

WordPiece parity with google-research/bert's FullTokenizer is checked against golden ids made by
tests/fixtures/make_tokenizer_fixtures.py (which ran the original code once; see its docstring).
"""

import gzip
import hashlib
import itertools
import json
import os
import pathlib

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.tokenizers import tokenizer as tokenizer_lib
from bert_jax.tokenizers import training as tokenizer_training

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "tokenizer"
SAMPLE = pathlib.Path(config_lib.BUNDLED_CORPUS)
# sha256 of (kind, settings, ordered vocab) for the bundled vocab: changes only if the vocab file
# or the fingerprint definition changes (both would invalidate every dataset and checkpoint).
BUNDLED_FINGERPRINT = "201f6d1c59c8e3f09de91b691ef0cbce788f1eaf6c498ad17c6f959c82f52e43"


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


@pytest.fixture(scope="module")
def spm_unigram(tmp_path_factory):
  out = tmp_path_factory.mktemp("spm") / "unigram.model"
  tok, _ = tokenizer_training.train(str(SAMPLE), "sentencepiece", 500, str(out))
  return tok, out


# --- WordPiece: parity with the reference ---------------------------------------------------


def test_bundled_vocab_special_ids(uncased):
  assert uncased.kind == "wordpiece"
  assert uncased.vocab_size == 30522
  assert (uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id, uncased.mask_id) == (
    0,
    100,
    101,
    102,
    103,
  )
  assert uncased.token_to_id("the") == 1996
  assert uncased.id_to_token(7308) == "mask"
  assert uncased.metadata() == {
    "kind": "wordpiece",
    "vocab_size": 30522,
    "fingerprint": BUNDLED_FINGERPRINT,
    "pad_id": 0,
    "cls_id": 101,
    "sep_id": 102,
    "mask_id": 103,
    "unk_id": 100,
  }


@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_edge_cases_match_reference(casing, request):
  tok = request.getfixturevalue(casing)
  data = _fixture("edge_cases.json")
  assert len(data["cases"]) > 60
  got = tok.encode_batch([c["text"] for c in data["cases"]])
  for case, ids in zip(data["cases"], got, strict=True):
    assert ids == case[casing], repr(case["text"][:80])
  # encode() is the same path one text at a time.
  for case in data["cases"][:20]:
    assert tok.encode(case["text"]) == case[casing]


def test_long_words_and_literal_special_tokens(uncased):
  word = "pneumonoultramicroscopicsilicovolcanoconiosis" * 5  # 225 chars
  # 101..200 characters still split into wordpieces (the `tokenizers` default stops at 100).
  for n in (101, 150, 200):
    ids = uncased.encode(word[:n])
    assert len(ids) > 1 and uncased.unk_id not in ids
    assert uncased.decode(ids) == word[:n]
  assert uncased.encode(word[:201]) == [uncased.unk_id]
  # Accents are stripped before the length check: 201 chars, 200 after stripping.
  assert uncased.unk_id not in uncased.encode("e\u0301" + "e" * 199)
  # A literal special token in raw text is ordinary text.
  assert uncased.encode("[MASK]") == [1031, 7308, 1033]
  assert uncased.tokenize("[CLS] x [SEP]") == ["[", "cl", "##s", "]", "x", "[", "sep", "]"]


def test_basic_tokenize_rules():
  bt = tokenizer_lib.basic_tokenize
  assert bt("Héllo,  WORLD!") == ["hello", ",", "world", "!"]
  assert bt("Héllo,  WORLD!", lowercase=False) == ["Héllo", ",", "WORLD", "!"]
  assert bt("ΟΔΟΣ.") == ["οδος", "."]  # str.lower's final sigma, as the original
  assert bt("中文abc") == ["中", "文", "abc"]
  assert bt("a\u200bb\x00c\ufffdd\u2003e") == ["abcd", "e"]  # Cf/NUL/U+FFFD dropped, Zs splits
  assert bt("a$b^c`d\u00b1e") == ["a", "$", "b", "^", "c", "`", "d\u00b1e"]  # ± is Sm: kept
  assert bt("x\ue000y") == ["x\ue000y"]  # private use is kept (the whole word becomes [UNK])


# Blocks of 4096 code points checked by default: ASCII/Latin/Greek/Cyrillic..., general
# punctuation and symbols, CJK symbols/kana, CJK ext A and unified, private use and compatibility
# ideographs, Hangul, emoji, CJK ext B, the tag block and plane 15 private use.
_DEFAULT_BLOCKS = (
  0x0,
  0x1000,
  0x2000,
  0x3000,
  0x4000,
  0x5000,
  0xA000,
  0xE000,
  0xF000,
  0x1F000,
  0x20000,
  0xE0000,
  0xF0000,
)


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


@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_codepoints_match_reference(casing, request):
  _check_codepoint_blocks(request.getfixturevalue(casing), casing, _DEFAULT_BLOCKS)


def test_corpus_sample_matches_reference(shared_data, uncased):
  sample = _fixture("corpus_sample.json")["ids"]
  assert len(sample) > 300
  wanted = {int(k) for k in sample}
  lines = itertools.islice(
    _corpus_lines(shared_data / "corpus" / "pretrain_corpus.txt.gz"), max(wanted) + 1
  )
  picked = [(i, line) for i, line in enumerate(lines) if i in wanted]
  assert len(picked) == len(sample)
  got = uncased.encode_batch([line for _, line in picked])
  for (i, line), ids in zip(picked, got, strict=True):
    assert ids == sample[str(i)], f"line {i}: {line[:80]!r}"


def test_encode_batch_decode_and_cache(uncased):
  texts = ["Unaffable people.", "", "unaffable", "the [MASK] 中文"]
  got = uncased.encode_batch(texts)
  assert got == [uncased.encode(t) for t in texts]
  assert got[0] == [14477, 20961, 3468, 2111, 1012]  # un ##aff ##able people .
  assert got[1] == []
  assert uncased.encode_batch([]) == []
  assert uncased.decode(got[0]) == "unaffable people ."
  # Cached word pieces are not shared between results.
  got[2].append(-1)
  assert uncased.encode("unaffable") == [14477, 20961, 3468]


def test_special_and_word_start_masks(uncased):
  special = uncased.special_mask()
  assert special.dtype == bool and special.shape == (30522,)
  unused = [i for i in range(30522) if uncased.id_to_token(i).startswith("[unused")]
  assert len(unused) == 994
  assert set(np.flatnonzero(special)) == {0, 100, 101, 102, 103, *unused}
  starts = uncased.word_start_mask()
  assert starts.shape == (30522,) and starts.dtype == bool
  assert starts[uncased.token_to_id("the")] and starts[uncased.token_to_id(",")]
  assert not starts[uncased.token_to_id("##able")]
  assert starts.sum() == 30522 - sum(uncased.id_to_token(i).startswith("##") for i in range(30522))


def test_fingerprint_stable_and_sensitive(tmp_path, uncased, cased):
  again = tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())
  assert again.fingerprint == uncased.fingerprint == BUNDLED_FINGERPRINT
  assert cased.fingerprint != uncased.fingerprint
  vocab = tokenizer_lib.read_vocab(tokenizer_lib.default_vocab_path())
  vocab[2000], vocab[2001] = vocab[2001], vocab[2000]
  assert tokenizer_lib.WordPieceTokenizer(vocab).fingerprint != uncased.fingerprint
  short = tokenizer_lib.WordPieceTokenizer(vocab[:-1])
  assert short.fingerprint != uncased.fingerprint and short.vocab_size == 30521


def test_save_load_round_trip(tmp_path, cased):
  cased.save(tmp_path / "tok")
  assert sorted(os.listdir(tmp_path / "tok")) == ["bert_jax_tokenizer.json", "vocab.txt"]
  back = tokenizer_lib.load_tokenizer(tmp_path / "tok")
  assert back.kind == "wordpiece" and back.lowercase is False
  assert back.fingerprint == cased.fingerprint
  assert back.encode("Héllo World") == cased.encode("Héllo World") == [100, 100]
  config = json.loads((tmp_path / "tok" / "bert_jax_tokenizer.json").read_text())
  assert config["fingerprint"] == cased.fingerprint and config["mask_id"] == 103
  # A directory saved before the rename (metadata under HF's name tokenizer.json) still loads.
  legacy = tmp_path / "legacy"
  legacy.mkdir()
  (legacy / "vocab.txt").write_bytes((tmp_path / "tok" / "vocab.txt").read_bytes())
  (legacy / "tokenizer.json").write_text(json.dumps(config))
  assert tokenizer_lib.load_tokenizer(legacy).fingerprint == cased.fingerprint
  # A vocab edited after saving no longer matches the stored fingerprint.
  vocab_file = tmp_path / "tok" / "vocab.txt"
  vocab_file.write_text(vocab_file.read_text().replace("\nthe\n", "\nthe_\n"))
  with pytest.raises(ValueError, match="fingerprint"):
    tokenizer_lib.load_tokenizer(tmp_path / "tok")


def test_load_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.txt"):
    tokenizer_lib.load_tokenizer(tmp_path / "nope.txt")
  bad = tmp_path / "vocab.txt"
  bad.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
  with pytest.raises(ValueError, match=r"vocab.txt.*\[MASK\]"):
    tokenizer_lib.load_tokenizer(bad)
  with pytest.raises(ValueError, match="unknown wordpiece tokenizer option"):
    tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path(), lower=True)
  with pytest.raises(FileNotFoundError, match="bert_jax_tokenizer.json"):
    tokenizer_lib.load_tokenizer(tmp_path)
  not_model = tmp_path / "x.model"
  not_model.write_bytes(b"\x00garbage")
  with pytest.raises(ValueError, match="x.model"):
    tokenizer_lib.load_tokenizer(not_model)


# --- SentencePiece --------------------------------------------------------------------------


def test_sentencepiece_train_and_load(spm_unigram, tmp_path):
  tok, path = spm_unigram
  assert tok.kind == "sentencepiece" and tok.vocab_size == 500
  assert [tok.id_to_token(i) for i in range(5)] == list(tokenizer_lib.SPECIAL_TOKENS)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  loaded = tokenizer_lib.load_tokenizer(path)
  assert loaded.fingerprint == tok.fingerprint
  text = "Alice was beginning to get very tired of sitting by her sister on the bank."
  ids = loaded.encode(text)
  assert ids == tok.encode_batch([text, "x"])[0]
  assert min(ids) >= 5 and loaded.decode(ids) == text
  assert loaded.token_to_id("\u2581the") in ids
  # Control pieces are never matched in raw text.
  assert tok.mask_id not in tok.encode("the [MASK] here")
  special = tok.special_mask()
  assert list(np.flatnonzero(special)) == [0, 1, 2, 3, 4]
  starts = tok.word_start_mask()
  assert starts[:5].all() and starts[tok.token_to_id("\u2581the")]
  assert starts[tok.token_to_id(".")]  # punctuation stands alone, as in WordPiece
  continuation = [i for i in range(5, 500) if not tok.id_to_token(i).startswith("\u2581")]
  assert any(not starts[i] for i in continuation)
  # Save/load round trip; a different model has a different fingerprint.
  tok.save(tmp_path / "sp")
  assert sorted(os.listdir(tmp_path / "sp")) == ["bert_jax_tokenizer.json", "spm.model"]
  back = tokenizer_lib.load_tokenizer(tmp_path / "sp")
  assert back.fingerprint == tok.fingerprint and back.encode(text) == ids
  bpe, _ = tokenizer_training.train(
    str(SAMPLE),
    "sentencepiece",
    400,
    str(tmp_path / "bpe.model"),
    lowercase=True,
    sp_model_type="bpe",
  )
  assert bpe.vocab_size == 400 and bpe.fingerprint != tok.fingerprint
  assert bpe.decode(bpe.encode("The Queen")) == "the queen"


def test_sentencepiece_fingerprint_ignores_training_knobs(spm_unigram):
  from sentencepiece import sentencepiece_model_pb2

  tok, path = spm_unigram
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(path.read_bytes())
  # Thread count and input paths are recorded in the model but do not change the ids.
  proto.trainer_spec.num_threads += 7
  proto.trainer_spec.input.append("/somewhere/else.txt")
  same = tokenizer_lib.SentencePieceTokenizer(proto.SerializeToString())
  assert same.fingerprint == tok.fingerprint
  proto.pieces[10].score += 0.5  # changes how unigram segments
  assert tokenizer_lib.SentencePieceTokenizer(proto.SerializeToString()).fingerprint != (
    tok.fingerprint
  )
