"""Tokenizers: BERT WordPiece (exactly as google-research/bert) and SentencePiece, one interface.

WordPiece reproduces the original `tokenization.FullTokenizer` id for id (tests check every line
of the shared corpus, every Unicode code point and hand-picked edge cases). The `tokenizers`
defaults differ from it in ways that change ids, so the text rules ("basic tokenization") run
here in Python and only the greedy longest-match WordPiece runs in Rust:
  * BERT drops only Cc/Cf control characters (and U+0000, U+FFFD); `BertNormalizer` also drops
    private-use, unassigned and surrogate code points, which BERT keeps (-> [UNK]).
  * BERT lower-cases each word with Python's `str.lower` (final sigma -> "ς") and then strips
    accents; `BertNormalizer` strips first and lower-cases character by character.
  * BERT's Unicode tables are Python's `unicodedata`; the Rust crates use other versions.
  * BERT splits words of up to 200 characters into wordpieces (longer -> [UNK]); the default
    `WordPiece` model makes anything over 100 characters [UNK].
  * A literal "[MASK]" in raw text is `[`, `mask`, `]`: special tokens are never matched in text,
    so they are not registered as `tokenizers` "added tokens" (their ids are still known).
The Python pass is a few `str.translate` calls with cached per-character tables, so it runs at
C speed; `encode_batch` then hands whole batches to the Rust WordPiece (parallel).

SentencePiece models (unigram or BPE) carry [PAD] [UNK] [CLS] [SEP] [MASK] as pad/unk/control
pieces at fixed ids 0-4 when trained by `bert_jax.train_tokenizer`; any model that has those five
pieces loads.

A tokenizer's `fingerprint` is a sha256 over its kind, its settings and its ordered vocabulary
(with scores for SentencePiece): it is stored with the data and the checkpoints so that a
mismatch is caught instead of silently training on the wrong ids.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import os
import re
import threading
import unicodedata
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What a text to fill marks a blank with (`bert_jax.load(...).fill_mask`, config.log.fill_mask):
# the [MASK] token, cut out before the text is tokenized.
MASK_TEXT = "[MASK]"
WORDPIECE_MAX_CHARS = 200  # google-research/bert WordpieceTokenizer.max_input_chars_per_word
# bert_jax's own tokenizer metadata. Not HuggingFace's `tokenizer.json`: that name belongs to
# the `tokenizers` format (which convert writes for export); directories saved before the
# rename carry LEGACY_CONFIG_FILE and still load.
CONFIG_FILE = "bert_jax_tokenizer.json"
TOKENIZER_DIR = "tokenizer"  # the directory workdirs, params dirs and feature heads keep it in
LEGACY_CONFIG_FILE = "tokenizer.json"
_WORD_CACHE_SIZE = 500_000  # distinct words kept per WordPiece tokenizer (~100 MB at most)
_FORMAT = "bert_jax.tokenizer/1"  # stored in tokenizer dirs: the name it had when written
_SP_PREFIX = "\u2581"  # "▁", SentencePiece's word-boundary marker


def default_vocab_path() -> str:
  """The bundled bert-base-uncased vocab.txt."""
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return os.path.join(package, "data", "bert-base-uncased-vocab.txt")


# --- BERT's basic tokenization as cached character tables -----------------------------------


def is_bert_punctuation(ch: str) -> bool:
  """BERT's punctuation: all non-alphanumeric printable ASCII, plus Unicode category P*."""
  cp = ord(ch)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
  # The "CJK Unified Ideographs" blocks BERT pads with spaces (not Hangul, Hiragana, Katakana).
  return (
    0x4E00 <= cp <= 0x9FFF
    or 0x3400 <= cp <= 0x4DBF
    or 0x20000 <= cp <= 0x2A6DF
    or 0x2A700 <= cp <= 0x2B73F
    or 0x2B740 <= cp <= 0x2B81F
    or 0x2B820 <= cp <= 0x2CEAF
    or 0xF900 <= cp <= 0xFAFF
    or 0x2F800 <= cp <= 0x2FA1F
  )


class _CharTable(dict):
  """A `str.translate` table filled lazily: each code point is classified once, then cached."""

  def __init__(self, rule):
    super().__init__()
    self._rule = rule

  def __missing__(self, cp: int):
    out = self[cp] = self._rule(cp)
    return out


def _clean_rule(cp: int):
  """Drop NUL, U+FFFD and control/format chars; whitespace -> ' '; pad CJK with spaces."""
  ch = chr(cp)
  if ch in " \t\n\r":
    return " "
  cat = unicodedata.category(ch)
  if cp == 0 or cp == 0xFFFD or cat in ("Cc", "Cf"):
    return None
  if cat == "Zs":
    return " "
  if _is_cjk(cp):
    return f" {ch} "
  return cp


def _punct_rule(cp: int):
  ch = chr(cp)
  return f" {ch} " if is_bert_punctuation(ch) else cp


def _strip_accents_punct_rule(cp: int):
  # Applied after NFD: drop nonspacing marks (accents), isolate punctuation.
  if unicodedata.category(chr(cp)) == "Mn":
    return None
  return _punct_rule(cp)


_CLEAN = _CharTable(_clean_rule)
_PUNCT = _CharTable(_punct_rule)
_STRIP_PUNCT = _CharTable(_strip_accents_punct_rule)


def basic_tokenize(text: str, lowercase: bool = True) -> list[str]:
  """BERT's BasicTokenizer: clean, split CJK, lower-case + strip accents, split punctuation.

  Equivalent to the per-word original because every step is either per character or (str.lower,
  NFD) does not look across the whitespace that separates words.
  """
  text = text.translate(_CLEAN)
  if lowercase:
    text = text.lower()
    if not text.isascii():
      return unicodedata.normalize("NFD", text).translate(_STRIP_PUNCT).split()
  return text.translate(_PUNCT).split()


# --- The interface -------------------------------------------------------------------------


class Tokenizer:
  """Common interface of the WordPiece and SentencePiece tokenizers (see module docstring)."""

  kind: str
  vocab_size: int
  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  fingerprint: str

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without [CLS]/[SEP]."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    raise NotImplementedError

  def decode(self, ids: Sequence[int]) -> str:
    raise NotImplementedError

  def id_to_token(self, i: int) -> str:
    raise NotImplementedError

  def token_to_id(self, t: str) -> int:
    """Id of token `t`; KeyError if it is not in the vocabulary."""
    raise NotImplementedError

  def tokenize(self, text: str) -> list[str]:
    return [self.id_to_token(i) for i in self.encode(text)]

  def special_mask(self) -> np.ndarray:
    """bool [vocab_size]: control tokens that masking must never pick or produce."""
    raise NotImplementedError

  def word_start_mask(self) -> np.ndarray:
    """bool [vocab_size]: True if a token begins a word (for whole-word masking)."""
    raise NotImplementedError

  def save(self, directory: str | os.PathLike) -> None:
    raise NotImplementedError

  def metadata(self) -> dict[str, Any]:
    """The `tokenizer` entry of create_data's metadata.json."""
    return {
      "kind": self.kind,
      "vocab_size": self.vocab_size,
      "fingerprint": self.fingerprint,
      "pad_id": self.pad_id,
      "cls_id": self.cls_id,
      "sep_id": self.sep_id,
      "mask_id": self.mask_id,
      "unk_id": self.unk_id,
    }

  def __repr__(self) -> str:
    return (
      f"{type(self).__name__}(vocab_size={self.vocab_size}, fingerprint={self.fingerprint[:12]})"
    )


def _sha256_json(obj: Any) -> str:
  blob = json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _write_atomic(path: str, data: bytes) -> None:
  """Writes `path` under a temporary name first, so a failure never leaves a partial file."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
  try:
    with open(tmp, "xb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _save_with_config(directory, files: dict[str, bytes], config: dict[str, Any]) -> None:
  # The config goes last: a directory without it is never mistaken for a saved tokenizer.
  directory = os.fspath(directory)
  for name, data in files.items():
    _write_atomic(os.path.join(directory, name), data)
  text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
  _write_atomic(os.path.join(directory, CONFIG_FILE), text.encode("utf-8"))


# --- WordPiece -----------------------------------------------------------------------------


def read_vocab(path: str | os.PathLike) -> list[str]:
  """A BERT vocab.txt: one token a line, id = line number (whitespace around a token dropped)."""
  path = os.fspath(path)
  try:
    with open(path, encoding="utf-8") as f:
      return [line.strip() for line in f]
  except UnicodeDecodeError as e:
    raise ValueError(
      f"{path}: vocab file is not UTF-8 text ({e.reason} at byte {e.start})"
    ) from None


class WordPieceTokenizer(Tokenizer):
  """BERT WordPiece with google-research/bert's exact rules (uncased or cased)."""

  kind = "wordpiece"

  def __init__(
    self,
    vocab: Sequence[str],
    lowercase: bool = True,
    max_input_chars_per_word: int = WORDPIECE_MAX_CHARS,
    source: str = "<vocab>",
  ):
    self._tokens = list(vocab)
    # A repeated token keeps its last id, as in BERT's load_vocab.
    self._vocab = {t: i for i, t in enumerate(self._tokens)}
    missing = [t for t in SPECIAL_TOKENS if t not in self._vocab]
    if missing:
      raise ValueError(f"{source}: vocab lacks special token(s) {', '.join(missing)}")
    self.lowercase = bool(lowercase)
    self.max_input_chars_per_word = int(max_input_chars_per_word)
    self.vocab_size = len(self._tokens)
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
      self._vocab[t] for t in SPECIAL_TOKENS
    )
    # Input reaches Rust already normalized and split by single spaces: no normalizer, no added
    # tokens, only whitespace splitting and the greedy longest-match-first WordPiece.
    hf = tokenizers.Tokenizer(
      models.WordPiece(
        vocab=self._vocab,
        unk_token="[UNK]",
        continuing_subword_prefix="##",
        max_input_chars_per_word=self.max_input_chars_per_word,
      )
    )
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    self._hf = hf
    self._word_cache: dict[str, list[int]] = {}
    self._lock = threading.Lock()
    self.fingerprint = _sha256_json(
      {
        "kind": self.kind,
        "lowercase": self.lowercase,
        "max_input_chars_per_word": self.max_input_chars_per_word,
        "vocab": self._tokens,
      }
    )

  @classmethod
  def from_file(cls, path: str | os.PathLike, **kwargs) -> WordPieceTokenizer:
    return cls(read_vocab(path), source=os.fspath(path), **kwargs)

  def basic_tokenize(self, text: str) -> list[str]:
    return basic_tokenize(text, self.lowercase)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    # Millions of small lists and no cycles: the cyclic GC would only re-scan them (2x slower).
    with self._lock:  # the word cache is shared
      gc_was_enabled = gc.isenabled()
      gc.disable()
      try:
        return self._encode_batch(texts)
      finally:
        if gc_was_enabled:
          gc.enable()

  def _encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    lower = self.lowercase
    words_per_text = [basic_tokenize(t, lower) for t in texts]
    # WordPiece splits each word on its own, and real text repeats words (Zipf): so only the
    # words not seen before go to Rust, and lines are assembled from cached pieces at C speed.
    cache = self._word_cache
    new = set(itertools.chain.from_iterable(words_per_text)).difference(cache)
    if len(cache) + len(new) > _WORD_CACHE_SIZE:
      cache.clear()
      new = set(itertools.chain.from_iterable(words_per_text))
    if new:
      new = list(new)
      encodings = self._hf.encode_batch_fast(new, add_special_tokens=False)
      for word, enc in zip(new, encodings, strict=True):
        cache[word] = enc.ids
    get = cache.__getitem__
    return [list(itertools.chain.from_iterable(map(get, words))) for words in words_per_text]

  def decode(self, ids: Sequence[int]) -> str:
    return " ".join(self.id_to_token(int(i)) for i in ids).replace(" ##", "")

  def id_to_token(self, i: int) -> str:
    return self._tokens[i]

  def token_to_id(self, t: str) -> int:
    return self._vocab[t]

  def special_mask(self) -> np.ndarray:
    # [PAD] [UNK] [CLS] [SEP] [MASK] and BERT's reserved "[unusedN]" slots, i.e. "[...]" tokens.
    pattern = re.compile(r"\[[^\[\]\s]+\]")
    mask = np.array([pattern.fullmatch(t) is not None for t in self._tokens], dtype=bool)
    mask[[self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]] = True
    return mask

  def word_start_mask(self) -> np.ndarray:
    return np.array([not t.startswith("##") for t in self._tokens], dtype=bool)

  def config(self) -> dict[str, Any]:
    return {
      "format": _FORMAT,
      "kind": self.kind,
      "file": "vocab.txt",
      "lowercase": self.lowercase,
      "max_input_chars_per_word": self.max_input_chars_per_word,
      **self.metadata(),
    }

  def save(self, directory: str | os.PathLike) -> None:
    vocab = "".join(t + "\n" for t in self._tokens).encode("utf-8")
    _save_with_config(directory, {"vocab.txt": vocab}, self.config())


# --- SentencePiece -------------------------------------------------------------------------

# TrainerSpec fields that change how a trained model encodes or decodes (the rest are training
# knobs, paths and thread counts, which must not change the fingerprint).
_SP_ENCODING_FIELDS = (
  "model_type",
  "treat_whitespace_as_suffix",
  "allow_whitespace_only_pieces",
  "byte_fallback",
  "unk_surface",
)


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (unigram or BPE) holding the five BERT special pieces."""

  kind = "sentencepiece"

  def __init__(self, model_proto: bytes, source: str = "<model>"):
    import sentencepiece as spm  # only SentencePiece users pay the import
    from sentencepiece import sentencepiece_model_pb2

    self._proto_bytes = bytes(model_proto)
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=self._proto_bytes)
    except RuntimeError as e:
      raise ValueError(f"{source}: not a SentencePiece model ({e})") from None
    self.vocab_size = int(self._sp.get_piece_size())
    self._pieces = [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
    self._vocab = {p: i for i, p in enumerate(self._pieces)}
    missing = [t for t in SPECIAL_TOKENS if t not in self._vocab]
    if missing:
      raise ValueError(
        f"{source}: SentencePiece model lacks piece(s) {', '.join(missing)} "
        "(train it with bert_jax.train_tokenizer)"
      )
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
      self._vocab[t] for t in SPECIAL_TOKENS
    )
    if self._sp.unk_id() != self.unk_id:
      raise ValueError(f"{source}: the model's unknown piece is not [UNK]")
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(self._proto_bytes)
    types = [int(p.type) for p in proto.pieces]
    self._types = types
    trainer = {f: getattr(proto.trainer_spec, f) for f in _SP_ENCODING_FIELDS}
    self.fingerprint = _sha256_json(
      {
        "kind": self.kind,
        "pieces": [[p.piece, repr(float(p.score)), int(p.type)] for p in proto.pieces],
        "trainer": trainer,
        "normalizer": proto.normalizer_spec.SerializeToString(deterministic=True).hex(),
        "denormalizer": proto.denormalizer_spec.SerializeToString(deterministic=True).hex(),
      }
    )

  def model_proto(self) -> bytes:
    """The serialized SentencePiece model."""
    return self._proto_bytes

  @classmethod
  def from_file(cls, path: str | os.PathLike) -> SentencePieceTokenizer:
    path = os.fspath(path)
    with open(path, "rb") as f:
      return cls(f.read(), source=path)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
      return []
    return self._sp.encode(list(texts), out_type=int, num_threads=os.cpu_count() or 1)

  def decode(self, ids: Sequence[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  def id_to_token(self, i: int) -> str:
    return self._pieces[i]

  def token_to_id(self, t: str) -> int:
    return self._vocab[t]

  def special_mask(self) -> np.ndarray:
    sp = self._sp
    mask = np.array(
      [sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) for i in range(self.vocab_size)],
      dtype=bool,
    )
    mask[[self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]] = True
    return mask

  def word_start_mask(self) -> np.ndarray:
    # "▁x" starts a word; so does a piece made only of punctuation ("," "." "?!"), which BERT's
    # WordPiece would also treat as a word of its own. Byte pieces "<0x..>" do not.
    special = self.special_mask()
    starts = []
    for i, p in enumerate(self._pieces):
      is_byte = self._types[i] == 6  # ModelProto.SentencePiece.BYTE
      punct = bool(p) and all(is_bert_punctuation(c) for c in p)
      starts.append(bool(special[i]) or (not is_byte and (p.startswith(_SP_PREFIX) or punct)))
    return np.array(starts, dtype=bool)

  def config(self) -> dict[str, Any]:
    return {"format": _FORMAT, "kind": self.kind, "file": "spm.model", **self.metadata()}

  def save(self, directory: str | os.PathLike) -> None:
    _save_with_config(directory, {"spm.model": self._proto_bytes}, self.config())


# --- Loading -------------------------------------------------------------------------------

_WORDPIECE_OPTIONS = ("lowercase", "max_input_chars_per_word")


def _check_overrides(path: str, kind: str, overrides: dict[str, Any]) -> None:
  allowed = _WORDPIECE_OPTIONS if kind == "wordpiece" else ()
  bad = sorted(set(overrides) - set(allowed))
  if bad:
    raise ValueError(f"{path}: unknown {kind} tokenizer option(s) {', '.join(bad)}")


def load_tokenizer(path: str | os.PathLike, **overrides) -> Tokenizer:
  """A vocab.txt -> WordPiece (lowercase=True unless overridden); a .model -> SentencePiece;
  a directory written by `Tokenizer.save` -> what it holds (fingerprint checked)."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such tokenizer file or directory")
  if os.path.isdir(path):
    config_path = os.path.join(path, CONFIG_FILE)
    legacy = os.path.join(path, LEGACY_CONFIG_FILE)
    if not os.path.isfile(config_path) and os.path.isfile(legacy):
      config_path = legacy
    if not os.path.isfile(config_path):
      raise FileNotFoundError(f"{config_path}: missing (not a directory written by save())")
    try:
      with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{config_path}: not valid JSON ({e})") from None
    if not isinstance(config, dict) or config.get("format") != _FORMAT:
      raise ValueError(f"{config_path}: not a {_FORMAT} config")
    kind = config.get("kind")
    if kind not in ("wordpiece", "sentencepiece"):
      raise ValueError(f"{config_path}: unknown tokenizer kind {kind!r}")
    _check_overrides(path, kind, overrides)
    file = os.path.join(path, os.path.basename(str(config.get("file", ""))))
    if not os.path.isfile(file):
      raise FileNotFoundError(f"{file}: missing (named in {config_path})")
    if kind == "wordpiece":
      options = {k: config[k] for k in _WORDPIECE_OPTIONS if k in config}
      tok = WordPieceTokenizer.from_file(file, **{**options, **overrides})
    else:
      tok = SentencePieceTokenizer.from_file(file)
    if not overrides and tok.fingerprint != config.get("fingerprint"):
      raise ValueError(
        f"{config_path}: fingerprint {config.get('fingerprint')} does not match the files "
        f"({tok.fingerprint})"
      )
    return tok
  if path.endswith(".model"):
    _check_overrides(path, "sentencepiece", overrides)
    return SentencePieceTokenizer.from_file(path)
  _check_overrides(path, "wordpiece", overrides)
  return WordPieceTokenizer.from_file(path, **overrides)
