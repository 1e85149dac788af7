"""Trains a WordPiece vocab.txt or a SentencePiece .model on text files.

The library behind `python -m bert_jax.train_tokenizer` (its flags are the arguments of `train`)
and the trainer's `config.data.train_vocab_size`:

  tok, reader = tokenizer_training.train("corpus/*.txt.gz", "wordpiece", 30522, "vocab.txt")

Input: .txt or .gz files, one sentence a line, blank lines between documents (blank lines are
skipped). Lines that are not UTF-8 and binary files (NUL bytes) are counted and skipped with a
warning naming the file, as create_data skips them (the trainer's `data.train_vocab_size`
trains on the same files it then builds its data from); an empty corpus or a glob that matches
nothing is a one-line error. The output is
written under a temporary name and renamed at the end, so a failed run leaves nothing behind.

WordPiece: the text goes through BERT's basic tokenization
(bert_jax.tokenizers.tokenizer.basic_tokenize,
the same as at encode time), then BPE-style merges with a fixed tie-break (_wordpiece_vocab): the
same corpus gives the same vocab.txt bytes on every run. vocab.txt starts with
[PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4). A vocab.txt does not record casing: load a cased one
with load_tokenizer(path, lowercase=False).
SentencePiece: [PAD]=0 (pad), [UNK]=1 (unk), [CLS]=2 [SEP]=3 [MASK]=4 (control pieces: never
matched in raw text); no BOS/EOS. --lowercase selects the nmt_nfkc_cf normalization.
"""

from __future__ import annotations

import collections
import gzip
import heapq
import io
import itertools
import os
import random
import zlib
from collections.abc import Iterable, Iterator

from absl import logging

from bert_jax.runtime import files
from bert_jax.tokenizers import tokenizer as tokenizer_lib

_SNIFF_BYTES = 8192
# SentencePiece trains on at most this many sentences (a uniform sample of a larger corpus).
_SP_MAX_SENTENCES = 10_000_000
_SP_THREADS = 16


class CorpusReader:
  """Iterates the non-blank lines of the files matching comma-separated globs; keeps counts."""

  def __init__(self, pattern: str):
    self.pattern = pattern
    self.files = files.expand_inputs(pattern)
    self.num_lines = 0
    self.num_bad_lines = 0
    self.num_binary_files = 0

  def _open(self, path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")

  def _file_lines(self, path: str) -> Iterator[str]:
    bad = 0
    try:
      with self._open(path) as f:
        head = f.read(_SNIFF_BYTES)
        if b"\x00" in head:
          logging.warning("%s looks binary (NUL bytes): skipped", path)
          self.num_binary_files += 1
          return
        # Lines as create_data reads them (files.read_lines: \n, \r\n or a lone \r ends one).
        f.seek(0)
        for raw in files.read_lines(f):
          line, ok = self._decode(raw)
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
    if not text.strip():
      return "", True
    self.num_lines += 1
    return text, True

  def __iter__(self) -> Iterator[str]:
    for path in self.files:
      yield from self._file_lines(path)

  def check_nonempty(self) -> None:
    if not self.num_lines:
      skipped = [f"{self.num_bad_lines} non-UTF-8 lines"] if self.num_bad_lines else []
      skipped += [f"{self.num_binary_files} binary files"] if self.num_binary_files else []
      raise ValueError(
        f"--input={self.pattern}: no text in {len(self.files)} file(s)"
        + (f" ({', '.join(skipped)} skipped)" if skipped else "")
      )


def train_wordpiece(
  reader: CorpusReader, vocab_size: int, lowercase: bool = True
) -> tokenizer_lib.WordPieceTokenizer:
  """A WordPiece vocab of the corpus; the same corpus always gives the same vocab.txt bytes."""
  word_counts: collections.Counter[str] = collections.Counter()
  for line in reader:
    word_counts.update(tokenizer_lib.basic_tokenize(line, lowercase))
  reader.check_nonempty()
  # BERT's own vocab has ~1k single characters; rarer ones become [UNK].
  limit_alphabet = min(1000, max(vocab_size // 4, 1))
  tokens = _wordpiece_vocab(word_counts, vocab_size, limit_alphabet)
  return tokenizer_lib.WordPieceTokenizer(tokens, lowercase=lowercase)


def _wordpiece_vocab(
  word_counts: dict[str, int], vocab_size: int, limit_alphabet: int
) -> list[str]:
  """Deterministic WordPiece vocab: BPE-style merges over word counts, ties by a fixed rule.

  The contract of `tokenizers`' WordPieceTrainer, minus its hash-map order: specials, the
  `limit_alphabet` most frequent characters (ties: smaller code point), their `##` forms where
  a character occurs inside a word, then one token per merge. Each step merges the most frequent
  adjacent pair; ties go to the lexicographically smallest (left, right) token strings. A
  character outside the alphabet splits its word, so no token spans a character that encodes as
  [UNK].
  """
  chars: dict[str, int] = {}
  for word, n in word_counts.items():
    for ch in word:
      chars[ch] = chars.get(ch, 0) + n
  alphabet = sorted(chars, key=lambda ch: (-chars[ch], ch))[:limit_alphabet]
  tokens = list(tokenizer_lib.SPECIAL_TOKENS) + sorted(alphabet)
  in_alphabet = set(alphabet)
  inner = sorted({ch for w in word_counts for ch in w[1:] if ch in in_alphabet})
  tokens += ["##" + ch for ch in inner]
  token_id = {t: i for i, t in enumerate(tokens)}

  # Each word (or alphabet-only piece of one) is a list of token ids with its count.
  words: list[list[int]] = []
  counts: list[int] = []
  for word in sorted(word_counts):
    n, piece = word_counts[word], []
    for i, ch in enumerate(word):
      if ch not in in_alphabet:
        if len(piece) > 1:
          words.append(piece)
          counts.append(n)
        piece = []
        continue
      piece.append(token_id[ch if i == 0 else "##" + ch])
    if len(piece) > 1:
      words.append(piece)
      counts.append(n)

  pair_count: dict[tuple[int, int], int] = {}
  where: dict[tuple[int, int], set[int]] = {}
  for w, (ids, n) in enumerate(zip(words, counts, strict=True)):
    for pair in itertools.pairwise(ids):
      pair_count[pair] = pair_count.get(pair, 0) + n
      where.setdefault(pair, set()).add(w)
  # Max-heap on (count, then smallest strings); stale entries are skipped when popped.
  heap = [(-c, tokens[a], tokens[b], a, b) for (a, b), c in pair_count.items()]
  heapq.heapify(heap)

  while len(tokens) < vocab_size and heap:
    neg, _, _, a, b = heapq.heappop(heap)
    if pair_count.get((a, b), 0) != -neg or not neg:
      continue
    right = tokens[b][2:] if tokens[b].startswith("##") else tokens[b]
    merged = tokens[a] + right
    new = token_id.get(merged)
    if new is None:
      new = token_id[merged] = len(tokens)
      tokens.append(merged)
    changed: dict[tuple[int, int], int] = {}
    for w in sorted(where.pop((a, b), ())):
      ids, n, out, i = words[w], counts[w], [], 0
      while i < len(ids):
        if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
          out.append(new)
          i += 2
        else:
          out.append(ids[i])
          i += 1
      if len(out) == len(ids):
        continue
      for pair in itertools.pairwise(ids):
        changed[pair] = changed.get(pair, 0) - n
      for pair in itertools.pairwise(out):
        changed[pair] = changed.get(pair, 0) + n
        where.setdefault(pair, set()).add(w)
      words[w] = out
    for pair, delta in changed.items():
      if delta:
        c = pair_count[pair] = pair_count.get(pair, 0) + delta
        if c > 0:
          heapq.heappush(heap, (-c, tokens[pair[0]], tokens[pair[1]], *pair))
        else:
          pair_count.pop(pair, None)
  return tokens[:vocab_size]


def _sample_sentences(sentences: Iterable[str], size: int, seed: int = 0) -> list[str]:
  """All sentences in order, or a uniform sample of `size` of them that the seed fixes."""
  rng = random.Random(seed)
  sample: list[str] = []
  for i, sentence in enumerate(sentences):
    if i < size:
      sample.append(sentence)
    else:
      j = rng.randrange(i + 1)  # reservoir sampling (Algorithm R)
      if j < size:
        sample[j] = sentence
  return sample


def train_sentencepiece(
  reader: CorpusReader, vocab_size: int, lowercase: bool = False, model_type: str = "unigram"
) -> tokenizer_lib.SentencePieceTokenizer:
  import sentencepiece as spm

  model = io.BytesIO()
  pad, unk, *control = tokenizer_lib.SPECIAL_TOKENS
  sentences = _sample_sentences(reader, _SP_MAX_SENTENCES)
  reader.check_nonempty()

  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
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
      # Sampled above with a fixed seed: SentencePiece's own sampling differed run to run even
      # after spm.set_random_generator_seed (0.2.3).
      input_sentence_size=0,
      shuffle_input_sentence=False,
      # The thread count partitions the EM sums (so the float results): a constant, not the
      # CPU count, gives the same .model bytes on any machine.
      num_threads=_SP_THREADS,
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
