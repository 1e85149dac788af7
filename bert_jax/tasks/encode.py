"""Examples -> unpadded model rows: [CLS] a [SEP] (b [SEP]) with segment ids and labels.

Rows (one dict per model input sequence; the engine pads them per length bucket):
  input_ids     int32 [L]   [CLS] text_a [SEP] (text_b [SEP])
  segment_ids   int32 [L]   0 over [CLS] a [SEP], 1 over b [SEP]
  label         int32 []    class index (-1 when unlabelled); float32 for regression (nan)
  label_ids     int32 [L]   tagging: the word's tag index on its first sub-token (UNKNOWN_TAG
                            in an unlabelled split), -1 elsewhere; losses and metrics read >= 0
  n_words       int32 []    tagging: words whose first sub-token fits (the rest are dropped from
                            the gold too, as transformers' run_ner does)
  example_index int32 []    position of the example in the split
Multiple choice: input_ids / segment_ids are [C, L] ([CLS] context [SEP] ending [SEP] per
choice, padded to the longest choice with pad_id / 0) and label is the right ending's index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bert_jax.tasks import kinds
from bert_jax.tasks.formats import TaggedExample, TextExample
from bert_jax.tokenizers.tokenizer import Tokenizer

# label_ids of a word's first sub-token whose tag is unknown (an unlabelled test split): no loss
# or metric reads it (they take ids >= 0); an unlabelled split's predictions file does.
UNKNOWN_TAG = -2


@dataclasses.dataclass
class Encoded:
  rows: list[dict[str, np.ndarray]]  # one per model input sequence
  n_examples: int
  n_truncated: int  # examples that lost tokens to max_seq_length


def truncate_pair(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
  """Lengths kept by BERT's `_truncate_seq_pair`: drop the last token of the longer text (of b
  on a tie) until both fit in `max_tokens`; computed in closed form instead of token by token."""
  excess = len_a + len_b - max_tokens
  if excess <= 0:
    return len_a, len_b
  gap = abs(len_a - len_b)
  if excess <= gap:  # only the longer one shrinks
    return (len_a - excess, len_b) if len_a > len_b else (len_a, len_b - excess)
  # Both are cut to the shorter's length, then b and a lose a token in turn, b first.
  rest = excess - gap
  short = min(len_a, len_b)
  return short - rest // 2, short - (rest + 1) // 2


def _scalar(value, dtype) -> np.ndarray:
  return np.asarray(value, dtype=dtype)


def _class_index(ex: TextExample, index: dict[str, int]) -> int:
  if ex.label is None:
    return -1
  try:
    return index[str(ex.label)]
  except KeyError:
    raise ValueError(
      f"{ex.source}: label {ex.label!r} is not one of the {len(index)} labels"
    ) from None


def _pair_row(
  tok: Tokenizer, a: list[int], b: list[int] | None, max_len: int
) -> tuple[np.ndarray, np.ndarray, bool]:
  """(input_ids, segment_ids, truncated) of [CLS] a [SEP] (b [SEP])."""
  if b is None:
    keep = max_len - 2
    ids = [tok.cls_id, *a[:keep], tok.sep_id]
    return np.asarray(ids, np.int32), np.zeros(len(ids), np.int32), len(a) > keep
  keep_a, keep_b = truncate_pair(len(a), len(b), max_len - 3)
  first = [tok.cls_id, *a[:keep_a], tok.sep_id]
  ids = first + b[:keep_b] + [tok.sep_id]
  segments = np.zeros(len(ids), np.int32)
  segments[len(first) :] = 1
  return np.asarray(ids, np.int32), segments, keep_a < len(a) or keep_b < len(b)


def _encode_text(
  examples: Sequence[TextExample],
  spec: kinds.Kind,
  tok: Tokenizer,
  max_len: int,
  labels: Sequence[str],
) -> Encoded:
  flat = tok.encode_batch([t for ex in examples for t in ex.texts])
  index = {name: i for i, name in enumerate(labels)}
  rows, n_truncated, pos = [], 0, 0
  for i, ex in enumerate(examples):
    if len(ex.texts) not in (1, 2):
      raise ValueError(f"{ex.source}: {len(ex.texts)} texts; {spec.name} takes one text or a pair")
    pieces = flat[pos : pos + len(ex.texts)]
    pos += len(ex.texts)
    second = pieces[1] if len(pieces) == 2 else None
    ids, segments, truncated = _pair_row(tok, pieces[0], second, max_len)
    n_truncated += truncated
    if spec.value_label:
      label = _scalar(np.nan if ex.label is None else float(ex.label), np.float32)
    else:
      label = _scalar(_class_index(ex, index), np.int32)
    rows.append(
      {
        "input_ids": ids,
        "segment_ids": segments,
        "label": label,
        "example_index": _scalar(i, np.int32),
      }
    )
  return Encoded(rows, len(examples), n_truncated)


def _choice_label(ex: TextExample, n_endings: int) -> int:
  if ex.label is None:
    return -1
  try:
    label = int(ex.label)
  except ValueError:
    label = -1
  if not 0 <= label < n_endings:
    raise ValueError(
      f"{ex.source}: label {ex.label!r} is not the index of one of the {n_endings} endings"
    )
  return label


def _encode_choices(examples: Sequence[TextExample], tok: Tokenizer, max_len: int) -> Encoded:
  flat = tok.encode_batch([t for ex in examples for t in ex.texts])
  rows, n_truncated, pos = [], 0, 0
  for i, ex in enumerate(examples):
    if len(ex.texts) < 2:
      raise ValueError(f"{ex.source}: multiple choice needs a context and at least one ending")
    context, *endings = flat[pos : pos + len(ex.texts)]
    pos += len(ex.texts)
    choices = [_pair_row(tok, context, ending, max_len) for ending in endings]
    n_truncated += any(c[2] for c in choices)
    width = max(len(c[0]) for c in choices)
    ids = np.full((len(choices), width), tok.pad_id, np.int32)
    segments = np.zeros((len(choices), width), np.int32)
    for c, (choice_ids, choice_segments, _) in enumerate(choices):
      ids[c, : len(choice_ids)] = choice_ids
      segments[c, : len(choice_segments)] = choice_segments
    rows.append(
      {
        "input_ids": ids,
        "segment_ids": segments,
        "label": _scalar(_choice_label(ex, len(endings)), np.int32),
        "example_index": _scalar(i, np.int32),
      }
    )
  return Encoded(rows, len(examples), n_truncated)


def _encode_tagged(
  examples: Sequence[TaggedExample], tok: Tokenizer, max_len: int, labels: Sequence[str]
) -> Encoded:
  # Each distinct word is tokenized once, on its own, so that sub-tokens align with words.
  vocab = list(dict.fromkeys(w for ex in examples for w in ex.words))
  pieces = dict(zip(vocab, tok.encode_batch(vocab), strict=True))
  unk = [tok.unk_id]
  index = {name: i for i, name in enumerate(labels)}
  keep = max_len - 2
  rows, n_truncated = [], 0
  for i, ex in enumerate(examples):
    ids, label_ids = [tok.cls_id], [-1]
    word_ids = [pieces[word] or unk for word in ex.words]  # no sub-tokens: the label goes on [UNK]
    n_truncated += sum(map(len, word_ids)) > keep
    n_words = 0
    for w, sub in enumerate(word_ids):
      room = keep - (len(ids) - 1)
      if room <= 0:
        break
      n_words += 1
      if ex.tags is None:
        tag = UNKNOWN_TAG  # a word start all the same: its predicted tag is written out
      else:
        tag = index.get(ex.tags[w])
        if tag is None:
          raise ValueError(
            f"{ex.source}: tag {ex.tags[w]!r} (word {w + 1}, {ex.words[w]!r}) is not one of the "
            f"{len(index)} labels"
          )
      kept = sub[:room]
      ids.extend(kept)
      label_ids.append(tag)
      label_ids.extend([-1] * (len(kept) - 1))
    ids.append(tok.sep_id)
    label_ids.append(-1)
    rows.append(
      {
        "input_ids": np.asarray(ids, np.int32),
        "segment_ids": np.zeros(len(ids), np.int32),
        "label_ids": np.asarray(label_ids, np.int32),
        "n_words": _scalar(n_words, np.int32),
        "example_index": _scalar(i, np.int32),
      }
    )
  return Encoded(rows, len(examples), n_truncated)


def encode(
  examples: Sequence[TextExample | TaggedExample],
  kind: str,
  tokenizer: Tokenizer,
  max_seq_length: int,
  labels: Sequence[str],
) -> Encoded:
  """Model rows for `examples` of task `kind` (see the module docstring).

  `labels` are the class / tag names in index order ([] for regression and multiple choice).
  """
  if max_seq_length < 3:
    raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS] x [SEP]")
  spec = kinds.get(kind, "encode: kind")
  if spec.examples == "tagged":
    if not all(isinstance(ex, TaggedExample) for ex in examples):
      raise ValueError(f"{kind} encodes TaggedExamples (read the task with kind={kind!r})")
    return _encode_tagged(examples, tokenizer, max_seq_length, labels)
  if spec.examples != "text":
    raise ValueError(f"encode: {kind} rows come from bert_jax.tasks.{spec.examples}")
  if not all(isinstance(ex, TextExample) for ex in examples):
    raise ValueError(f"{kind} encodes TextExamples, not tagged sentences")
  if spec.choices:
    return _encode_choices(examples, tokenizer, max_seq_length)
  return _encode_text(examples, spec, tokenizer, max_seq_length, labels)
