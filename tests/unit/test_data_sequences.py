"""bert_jax.data.sequences: NSP pairs as BERT's create_pretraining_data draws them, truncation,
packing."""

import random

import numpy as np

from bert_jax.data import sequences


def _int_docs(n_docs, rng):
  """Token ids that encode (document, position): doc d's tokens are d*10000 + 0, 1, 2, ..."""
  docs = []
  for d in range(n_docs):
    sentences, pos = [], 0
    for _ in range(rng.randint(1, 30)):
      n = rng.randint(1, 40)
      sentences.append(list(range(d * 10000 + pos, d * 10000 + pos + n)))
      pos += n
    docs.append(sentences)
  return docs


def test_nsp_pairs_follow_bert():
  rng = random.Random(0)
  docs = _int_docs(40, rng)
  out = []
  for i in range(len(docs)):
    sequences.nsp_pairs(docs, i, 64, 0.1, rng, lambda a, b, r, i=i: out.append((i, a, b, r)))
  assert len(out) > 100
  for i, a, b, random_next in out:
    assert 2 <= len(a) + len(b) <= 61 and a and b
    # Each side is one contiguous run of one document (truncation trims only the ends).
    for side in (a, b):
      assert side == list(range(side[0], side[0] + len(side)))
    assert a[0] // 10000 == i
    if random_next:
      assert b[0] // 10000 != i
    else:
      assert b[0] // 10000 == i and b[0] > a[-1]
  share = np.mean([r for *_, r in out])
  assert 0.4 < share < 0.7  # 50% plus forced random for one-sentence chunks


def test_nsp_pairs_use_every_sentence_once_when_no_random_next():
  # A 2-document corpus with long sentences: with short_seq_prob=0 all real-next pairs of a
  # document tile it; random-next pairs put the unused sentences back.
  rng = random.Random(3)
  docs = _int_docs(2, rng)
  covered = set()
  for i in range(2):

    def emit(a, b, r):
      covered.update(a)
      if not r:
        covered.update(b)

    sequences.nsp_pairs(docs, i, 512, 0.0, rng, emit)
  # Untruncated (512 is plenty): every token of both documents appears in some A or real B.
  assert covered == {t for d in docs for s in d for t in s}


def test_truncate_pair_trims_longer_side():
  rng = random.Random(0)
  a, b = sequences.truncate_pair(list(range(100)), list(range(100, 110)), 50, rng)
  assert len(a) + len(b) == 50 and len(b) == 10
  assert a == list(range(a[0], a[0] + 40)) and 0 < a[0] < 60  # trimmed at both ends


def test_packing_full_and_doc_sentences():
  docs = [[[1] * 10, [2] * 10], [[3] * 5], [[4] * 200]]
  full, per_doc = [], []
  sequences.packed(docs, 32, True, 102, lambda a, b, r: full.append(a))
  truncated = sequences.packed(docs, 32, False, 102, lambda a, b, r: per_doc.append(a))
  assert full == [[1] * 10 + [2] * 10 + [102] + [3] * 5, [4] * 30]
  assert per_doc == [[1] * 10 + [2] * 10, [3] * 5, [4] * 30] and truncated == 1
