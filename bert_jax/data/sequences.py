"""BERT's sequence algorithm: tokenized documents -> pretraining sequences (before masking).

With NSP, google-research/bert `create_instances_from_document`: a target length of
max_seq_length - 3 (a random shorter one with probability short_seq_prob, drawn per document),
sentences accumulated until the chunk reaches it, segment A a random prefix of the chunk, B its
real continuation (50%) or a random span of another document (unused sentences are put back),
then the longer segment trimmed at a random end until the pair fits. Without NSP, sentences
packed up to max_seq_length - 2 tokens (RoBERTa FULL-SENTENCES, a [SEP] between documents; or
DOC-SENTENCES, never crossing a document boundary); a sentence longer than that is truncated.

`chunk_sequences` runs this over one work unit (a chunk of documents) for every dupe pass, with
a random generator seeded from (seed, split, dupe pass, chunk index): the same chunk always
gives the same sequences, in whichever process it runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random

import numpy as np

from bert_jax.data import records

PACKINGS = ("nsp_pairs", "full_sentences", "doc_sentences")


# Passes over the corpus, each re-drawing segmentation and NSP pairs (and the static masks: a
# static mask is fixed per example). The one default, of create_data and of the data a training
# config builds on first use: 1, since the trainer masks on the fly. google-research/bert's was
# 10, to re-draw the masks it stored: the README's BERT data passes --dupe_factor=10.
DUPE_FACTOR = 1


@dataclasses.dataclass(frozen=True)
class Options:
  """Everything that shapes a create_data output (each worker gets a copy)."""

  vocab: str
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  dupe_factor: int = DUPE_FACTOR
  seed: int = 12345
  nsp: bool = True
  packing: str = "full_sentences"  # used when nsp=False
  eval_fraction: float = 0.01
  write_masks: bool = False
  whole_word_mask: bool = False

  @property
  def layout(self) -> str:
    return "nsp_pairs" if self.nsp else self.packing

  def validate(self) -> None:
    """Each option's type and range: bert_jax.config_schema (a ConfigError names the flag)."""
    from bert_jax import config_schema

    options = {k: v for k, v in dataclasses.asdict(self).items() if k != "vocab"}
    config_schema.check_data_build(options)


def seeded_rng(*parts) -> random.Random:
  """A generator seeded from a hash of parts (stable across processes and Python versions)."""
  key = "/".join(map(str, parts)).encode()
  return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))


def unit_rng(seed: int, split: str, dupe: int, chunk: int) -> random.Random:
  return seeded_rng(seed, split, dupe, chunk)


def truncate_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random):
  """BERT's truncate_seq_pair: trim the longer side at a random end until the pair fits."""
  a0, a1, b0, b1 = 0, len(a), 0, len(b)
  while (a1 - a0) + (b1 - b0) > max_num_tokens:
    front = rng.random() < 0.5
    if a1 - a0 > b1 - b0:
      if front:
        a0 += 1
      else:
        a1 -= 1
    elif front:
      b0 += 1
    else:
      b1 -= 1
  return a[a0:a1], b[b0:b1]


def nsp_pairs(
  docs: list[list[list[int]]],
  index: int,
  max_seq_length: int,
  short_seq_prob: float,
  rng: random.Random,
  emit,
) -> None:
  """Sequences of one document, as BERT's create_instances_from_document (before masking)."""
  document = docs[index]
  max_num_tokens = max_seq_length - 3
  target = max_num_tokens
  if rng.random() < short_seq_prob:
    target = rng.randint(2, max_num_tokens)
  chunk: list[list[int]] = []
  length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    length += len(document[i])
    if i == len(document) - 1 or length >= target:
      a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
      tokens_a = [t for s in chunk[:a_end] for t in s]
      tokens_b: list[int] = []
      if len(chunk) == 1 or rng.random() < 0.5:
        is_random_next = True
        target_b = target - len(tokens_a)
        for _ in range(10):  # avoid the same document (a one-document chunk cannot)
          other = rng.randint(0, len(docs) - 1)
          if other != index:
            break
        other_doc = docs[other]
        for j in range(rng.randint(0, len(other_doc) - 1), len(other_doc)):
          tokens_b.extend(other_doc[j])
          if len(tokens_b) >= target_b:
            break
        i -= len(chunk) - a_end  # put the unused sentences back
      else:
        is_random_next = False
        tokens_b = [t for s in chunk[a_end:] for t in s]
      tokens_a, tokens_b = truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
      emit(tokens_a, tokens_b, is_random_next)
      chunk, length = [], 0
    i += 1


def packed(
  docs: list[list[list[int]]], max_seq_length: int, cross_documents: bool, sep_id: int, emit
) -> int:
  """Full sentences packed up to max_seq_length - 2 tokens; returns #truncated sentences."""
  cap = max_seq_length - 2
  truncated = 0
  current: list[int] = []
  doc_break = False
  for doc in docs:
    for sentence in doc:
      if len(sentence) > cap:
        sentence = sentence[:cap]
        truncated += 1
      extra = 1 if (doc_break and current) else 0
      if current and len(current) + extra + len(sentence) > cap:
        emit(current, [], False)
        current, extra = [], 0
      if extra:
        current.append(sep_id)  # RoBERTa's separator between documents
      doc_break = False
      current.extend(sentence)
    if cross_documents:
      doc_break = True
    elif current:
      emit(current, [], False)
      current = []
  if current:
    emit(current, [], False)
  return truncated


def chunk_sequences(split: str, index: int, texts: list[list[str]], opts: Options, tok) -> dict:
  """Tokenizes chunk `index` of `split` (documents of sentences) and builds its sequences, all
  dupe passes for train, one for eval: token arrays plus counts."""
  ids = tok.encode_batch([s for doc in texts for s in doc])
  docs: list[list[list[int]]] = []
  k = 0
  no_tokens = 0
  for doc in texts:
    tdoc = []
    for _ in doc:
      if ids[k]:
        tdoc.append(ids[k])
      else:
        no_tokens += 1
      k += 1
    if tdoc:
      docs.append(tdoc)
  del ids

  cls, sep = tok.cls_id, tok.sep_id
  tokens: list[int] = []
  lengths: list[int] = []
  len_as: list[int] = []
  labels: list[int] = []

  def emit(a: list[int], b: list[int], is_random_next: bool) -> None:
    tokens.append(cls)
    tokens.extend(a)
    tokens.append(sep)
    len_as.append(len(a) + 2)
    if b:
      tokens.extend(b)
      tokens.append(sep)
      lengths.append(len(a) + len(b) + 3)
    else:
      lengths.append(len(a) + 2)
    labels.append(int(is_random_next))

  truncated = 0
  passes = opts.dupe_factor if split == "train" else 1
  for dupe in range(passes):
    if opts.nsp:
      rng = unit_rng(opts.seed, split, dupe, index)
      for i in range(len(docs)):
        nsp_pairs(docs, i, opts.max_seq_length, opts.short_seq_prob, rng, emit)
    else:
      truncated += packed(docs, opts.max_seq_length, opts.packing == "full_sentences", sep, emit)
  dtype = records.token_dtype(tok.vocab_size)
  return dict(
    split=split,
    tokens=np.asarray(tokens, dtype=dtype),
    lengths=np.asarray(lengths, dtype=np.int64),
    len_a=np.asarray(len_as, dtype=np.int64),
    labels=np.asarray(labels, dtype=np.uint8),
    documents=len(docs),
    sentences=sum(len(d) for d in docs),
    sentences_without_tokens=no_tokens,
    truncated_sentences=truncated,
  )
