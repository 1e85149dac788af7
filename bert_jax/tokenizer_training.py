"""Trains a WordPiece vocab.txt or a SentencePiece .model on text files.

The library behind `python -m bert_jax.train_tokenizer` (its flags are the arguments of `train`)
and the trainer's `config.data.train_vocab_size`:

  tok, reader = tokenizer_training.train("corpus/*.txt.gz", "wordpiece", 30522, "vocab.txt")

Input: .txt or .gz files, one sentence a line, blank lines between documents (blank lines are
skipped). Lines that are not UTF-8 are counted and skipped with a warning naming the file; a
binary file, an empty corpus or a glob that matches nothing is a one-line error. The output is
written under a temporary name and renamed at the end, so a failed run leaves nothing behind.

WordPiece: the text goes through BERT's basic tokenization (bert_jax.tokenizer.basic_tokenize,
the same as at encode time), then the `tokenizers` WordPiece trainer. vocab.txt starts with
[PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4). A vocab.txt does not record casing: load a cased one
with load_tokenizer(path, lowercase=False).
SentencePiece: [PAD]=0 (pad), [UNK]=1 (unk), [CLS]=2 [SEP]=3 [MASK]=4 (control pieces: never
matched in raw text); no BOS/EOS. --lowercase selects the nmt_nfkc_cf normalization.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator

from absl import logging

from bert_jax import pretraining_data
from bert_jax import tokenizer as tokenizer_lib

_SNIFF_BYTES = 8192


class CorpusReader:
  """Iterates the non-blank lines of the files matching comma-separated globs; keeps counts."""

  def __init__(self, pattern: str):
    self.pattern = pattern
    self.files = pretraining_data.expand_inputs(pattern)
    self.num_lines = 0
    self.num_bad_lines = 0

  def _open(self, path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")

  def _file_lines(self, path: str) -> Iterator[str]:
    bad = 0
    try:
      with self._open(path) as f:
        head = f.read(_SNIFF_BYTES)
        if b"\x00" in head:
          raise ValueError(f"{path}: looks binary (NUL bytes), expected UTF-8 text")
        # Only b"\n" ends a line: a stray "\r" or U+2028 is text, as in create_data.
        pending, chunk = b"", head
        while chunk:
          *lines, pending = (pending + chunk).split(b"\n")
          for raw in lines:
            line, ok = self._decode(raw)
            bad += not ok
            if line:
              yield line
          chunk = f.read(1 << 20)
        if pending:
          line, ok = self._decode(pending)
          bad += not ok
          if line:
            yield line
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
      raise ValueError(f"{path}: not a readable gzip file ({e})") from None
    if bad:
      logging.warning("%s: skipped %d line(s) that are not UTF-8", path, bad)
      self.num_bad_lines += bad

  def _decode(self, raw: bytes) -> tuple[str, bool]:
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError:
      return "", False
    if text.endswith("\r"):  # CRLF files
      text = text[:-1]
    if not text.strip():
      return "", True
    self.num_lines += 1
    return text, True

  def __iter__(self) -> Iterator[str]:
    for path in self.files:
      yield from self._file_lines(path)

  def check_nonempty(self) -> None:
    if not self.num_lines:
      raise ValueError(
        f"--input={self.pattern}: no text in {len(self.files)} file(s)"
        + (f" ({self.num_bad_lines} non-UTF-8 lines skipped)" if self.num_bad_lines else "")
      )


def train_wordpiece(
  reader: CorpusReader, vocab_size: int, lowercase: bool = True
) -> tokenizer_lib.WordPieceTokenizer:
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers

  hf = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  trainer = trainers.WordPieceTrainer(
    vocab_size=vocab_size,
    special_tokens=list(tokenizer_lib.SPECIAL_TOKENS),
    continuing_subword_prefix="##",
    # BERT's own vocab has ~1k single characters; rarer ones become [UNK].
    limit_alphabet=min(1000, max(vocab_size // 4, 1)),
    show_progress=False,
  )

  def batches():
    batch = []
    for line in reader:
      batch.append(" ".join(tokenizer_lib.basic_tokenize(line, lowercase)))
      if len(batch) == 1000:
        yield batch
        batch = []
    yield batch

  hf.train_from_iterator(batches(), trainer=trainer)
  reader.check_nonempty()
  vocab = sorted(hf.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
  tokens = [t for t, _ in vocab]
  assert tokens[: len(tokenizer_lib.SPECIAL_TOKENS)] == list(tokenizer_lib.SPECIAL_TOKENS), tokens[
    :5
  ]
  return tokenizer_lib.WordPieceTokenizer(tokens, lowercase=lowercase)


def train_sentencepiece(
  reader: CorpusReader, vocab_size: int, lowercase: bool = False, model_type: str = "unigram"
) -> tokenizer_lib.SentencePieceTokenizer:
  import sentencepiece as spm

  model = io.BytesIO()
  pad, unk, *control = tokenizer_lib.SPECIAL_TOKENS
  sentences = iter(reader)
  try:
    first = next(sentences)
  except StopIteration:
    first = None
  reader.check_nonempty()

  def all_sentences():
    yield first
    yield from sentences

  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=all_sentences(),
      model_writer=model,
      model_type=model_type,
      vocab_size=vocab_size,
      hard_vocab_limit=False,  # a small corpus yields a smaller vocab instead of an error
      pad_id=0,
      unk_id=1,
      bos_id=-1,
      eos_id=-1,
      pad_piece=pad,
      unk_piece=unk,
      control_symbols=control,
      normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
      input_sentence_size=10_000_000,
      shuffle_input_sentence=True,
      num_threads=os.cpu_count() or 1,
      minloglevel=2,
    )
  except RuntimeError as e:
    raise ValueError(f"--input={reader.pattern}: SentencePiece training failed: {e}") from None
  return tokenizer_lib.SentencePieceTokenizer(model.getvalue(), source="<trained>")


def train(
  input_pattern: str,
  kind: str,
  vocab_size: int,
  output: str,
  lowercase: bool | None = None,
  sp_model_type: str = "unigram",
) -> tuple[tokenizer_lib.Tokenizer, CorpusReader]:
  """Trains a tokenizer and writes it to `output` (vocab.txt or .model). Returns it + counts."""
  if kind not in ("wordpiece", "sentencepiece"):
    raise ValueError(f"--kind={kind}: expected wordpiece or sentencepiece")
  if vocab_size < len(tokenizer_lib.SPECIAL_TOKENS) + 1:
    raise ValueError(f"--vocab_size={vocab_size}: too small")
  if sp_model_type not in ("unigram", "bpe"):
    raise ValueError(f"--sp_model_type={sp_model_type}: expected unigram or bpe")
  if kind == "sentencepiece" and not output.endswith(".model"):
    raise ValueError(f"--output={output}: a SentencePiece model must end in .model")
  if kind == "wordpiece" and output.endswith(".model"):
    raise ValueError(f"--output={output}: a WordPiece vocab must not end in .model")
  if os.path.isdir(output):
    raise ValueError(f"--output={output}: is a directory, expected a file path")
  reader = CorpusReader(input_pattern)
  if kind == "wordpiece":
    tok = train_wordpiece(reader, vocab_size, True if lowercase is None else lowercase)
    data = "".join(tok.id_to_token(i) + "\n" for i in range(tok.vocab_size)).encode("utf-8")
  else:
    tok = train_sentencepiece(reader, vocab_size, bool(lowercase), sp_model_type)
    data = tok._proto_bytes
  tokenizer_lib._write_atomic(output, data)
  return tok, reader
