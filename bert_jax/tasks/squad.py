"""Extractive QA (SQuAD v1.1 / v2.0): reading, windows, n-best decoding and the official EM/F1.

Follows google-research/bert's run_squad.py: the context is split into whitespace-separated doc
words, each word into its sub-tokens; a question + context pair becomes one or more windows
`[CLS] query [SEP] window [SEP]` that overlap by `doc_stride`; a token is scored only in the
window where it has the most context; answers are searched in the n-best starts and ends.

Deviations from the original, each on purpose:
  * An `answer_start` that does not point at its text is re-anchored to the text's occurrence
    nearest to it when that is unambiguous, else the answer is not trained on (the original
    trains on whatever span the offset names). Counts come back from `read_squad`.
  * Reference texts lose surrounding whitespace (the official metric ignores it), so a training
    span never starts on a space (which the original maps onto the previous word).
  * The n-best lists hold only tokens that can start / end an answer, so a valid span is always
    found when one exists (the original takes the n-best over the whole window, query included).
  * The answer text is the context substring (original spacing) rather than re-joined words.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import math
import os
import re
import string
from collections.abc import Sequence

import numpy as np

from bert_jax.tokenizers import tokenizer as tokenizer_lib

try:
  from bert_jax.tasks.encode import Encoded
except ImportError:  # bert_jax.tasks.encode (branch "readers") not merged yet: same fields.

  @dataclasses.dataclass
  class Encoded:
    rows: list[dict[str, np.ndarray]]  # one per model input sequence
    n_examples: int
    n_truncated: int  # examples that lost tokens to max_seq_length


# An offset that misses its text is moved to an occurrence at most this many characters away
# when it is the only one there (squadshifts/amazon_reviews offsets are off by 1 to 42 chars).
REANCHOR_WINDOW = 64
_MAX_ERROR_EXAMPLES = 10


@dataclasses.dataclass(frozen=True)
class QAExample:
  """One question on one context."""

  qid: str
  question: str
  context: str
  answers: tuple[str, ...]  # all reference texts (stripped), first = training target
  answer_start: int | None  # char offset of answers[0] in context; None: not trainable
  is_impossible: bool  # SQuAD 2.0 question without an answer
  source: str  # "path:article/paragraph/qa" for errors


@dataclasses.dataclass(frozen=True)
class WindowMeta:
  """What decoding needs to know about one row (window) of `encode_squad`."""

  example_index: int
  token_to_word: np.ndarray  # int32 [L_row]: doc-word index of each token, -1 outside the doc
  token_is_max_context: np.ndarray  # bool [L_row]: this window scores the token
  input_ids: np.ndarray  # int32 [L_row]: the row's ids (the same array, for answer alignment)
  doc_offset: int  # row position of the window's first context token (len(query) + 2)
  doc_start: int  # index of that token among the context's sub-tokens


# --- Reading ------------------------------------------------------------------------------


def _load_json(path: str):
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(
      f"{path}:{e.lineno}: not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
    ) from None
  except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
    raise ValueError(f"{path}: cannot be read as (gzipped) UTF-8 JSON ({e})") from None


def _anchor(context: str, text: str, start: int) -> tuple[int | None, str]:
  """(start of the stripped `text` in `context` or None, "ok" | "reanchored" | why dropped)."""
  stripped = text.strip()
  if not stripped:
    return None, "empty answer text"
  if isinstance(start, int) and 0 <= start and context[start : start + len(text)] == text:
    return start + len(text) - len(text.lstrip()), "ok"
  occurrences = [m.start() for m in re.finditer(re.escape(stripped), context)]
  if not occurrences:
    return None, f"answer {stripped!r} not in context"
  if len(occurrences) == 1:
    return occurrences[0], "reanchored"
  if isinstance(start, int):
    near = [i for i in occurrences if abs(i - start) <= REANCHOR_WINDOW]
    if len(near) == 1:
      return near[0], "reanchored"
  return None, f"answer {stripped!r} at {start} is ambiguous ({len(occurrences)} occurrences)"


def _field(obj: dict, key: str, kind: type, where: str):
  value = obj.get(key) if isinstance(obj, dict) else None
  if not isinstance(value, kind):
    name = getattr(kind, "__name__", str(kind))
    raise ValueError(f"{where}: missing or malformed {key!r} (expected {name})")
  return value


def read_squad(paths: str | Sequence[str], max_examples: int = 0) -> tuple[list[QAExample], dict]:
  """Examples from SQuAD v1.1 / v2.0 JSON files (plain or .gz), in file order.

  Every answer's offset is checked. Returns (examples, stats): stats = {"checked", "ok",
  "reanchored", "dropped"} counted over answers, "untrainable" (examples with no usable answer,
  kept for evaluation but skipped by `encode_squad(training=True)`; also a question without
  answers that is not `is_impossible`, as in an unlabelled test file) and "examples"
  (the first few "qid: why"). The training target is the first answer that is usable; it is
  moved to the front of `answers` (order does not matter to EM/F1, a max over references).
  """
  if isinstance(paths, str | os.PathLike):
    paths = [paths]
  examples: list[QAExample] = []
  stats = {"checked": 0, "ok": 0, "reanchored": 0, "dropped": 0, "untrainable": 0}
  notes: list[str] = []
  for path in map(os.fspath, paths):
    data = _field(_load_json(path), "data", list, path)
    for a, article in enumerate(data):
      paragraphs = _field(article, "paragraphs", list, f"{path}:{a}")
      for p, paragraph in enumerate(paragraphs):
        context = _field(paragraph, "context", str, f"{path}:{a}/{p}")
        for q, qa in enumerate(_field(paragraph, "qas", list, f"{path}:{a}/{p}")):
          source = f"{path}:{a}/{p}/{q}"
          qid = str(_field(qa, "id", str | int, source))
          question = _field(qa, "question", str, source)
          impossible = bool(qa.get("is_impossible", False))
          answers = [] if impossible else _field(qa, "answers", list, source)
          texts, target = [], None
          for answer in answers:
            text = _field(answer, "text", str, source)
            start, why = _anchor(context, text, answer.get("answer_start"))
            stats["checked"] += 1
            stats["ok" if why == "ok" else "reanchored" if start is not None else "dropped"] += 1
            if why != "ok" and len(notes) < _MAX_ERROR_EXAMPLES:
              notes.append(f"{qid}: {why}" if start is None else f"{qid}: {why} to {start}")
            if start is not None and target is None:
              target = (text.strip(), start)
            else:
              texts.append(text.strip())
          if target is not None:
            texts.insert(0, target[0])
          elif not impossible:
            stats["untrainable"] += 1
          examples.append(
            QAExample(
              qid=qid,
              question=question,
              context=context,
              answers=tuple(texts),
              answer_start=None if target is None else target[1],
              is_impossible=impossible,
              source=source,
            )
          )
          if max_examples and len(examples) >= max_examples:
            return examples, {**stats, "examples": notes}
  return examples, {**stats, "examples": notes}


# --- Windows ------------------------------------------------------------------------------


def _is_whitespace(c: str) -> bool:
  # run_squad.py's rule (U+202F narrow no-break space included, other Unicode spaces not).
  return c in " \t\r\n" or ord(c) == 0x202F


def doc_words(context: str) -> tuple[list[str], list[tuple[int, int]]]:
  """The context's whitespace-separated words and their [start, end) character spans."""
  words, spans = [], []
  start = None
  for i, c in enumerate(context):
    if _is_whitespace(c):
      if start is not None:
        words.append(context[start:i])
        spans.append((start, i))
        start = None
    elif start is None:
      start = i
  if start is not None:
    words.append(context[start:])
    spans.append((start, len(context)))
  return words, spans


def window_starts(n_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
  """(start, length) of the doc windows, as run_squad: advance by doc_stride until the end."""
  spans, start = [], 0
  while True:
    length = min(n_tokens - start, max_tokens)
    spans.append((start, length))
    if start + length >= n_tokens:
      return spans
    start += min(length, doc_stride)


def max_context_window(spans: Sequence[tuple[int, int]], n_tokens: int) -> np.ndarray:
  """int [n_tokens]: the window where each doc token has the most context.

  Score in window w = min(tokens left, tokens right) + 0.01 * window length; the first window
  wins a tie (run_squad's _check_is_max_context).
  """
  pos = np.arange(n_tokens)[:, None]
  start = np.array([s for s, _ in spans])[None, :]
  length = np.array([n for _, n in spans])[None, :]
  inside = (pos >= start) & (pos < start + length)
  score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
  return np.argmax(np.where(inside, score, -np.inf), axis=1)


def _improve_answer_span(doc_ids, start: int, end: int, answer_ids: list[int]):
  # The tightest sub-token span whose tokens equal the answer's own (e.g. "1895" in "(1895)").
  n = len(answer_ids)
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if new_end - new_start + 1 == n and doc_ids[new_start : new_end + 1] == answer_ids:
        return new_start, new_end
  return start, end


def encode_squad(
  examples: Sequence[QAExample],
  tokenizer: tokenizer_lib.Tokenizer,
  max_seq_length: int = 384,
  doc_stride: int = 128,
  max_query_length: int = 64,
  *,
  training: bool,
) -> tuple[Encoded, list[WindowMeta]]:
  """Rows `[CLS] query [SEP] window [SEP]` and their WindowMeta, one per window.

  Row fields: input_ids, segment_ids (0 for [CLS] query [SEP], 1 after), start_positions and
  end_positions (the answer's first / last token, 0 = [CLS] when the answer is not wholly in
  this window, the example is impossible or has no usable answer), example_index.
  training=True leaves out examples with no usable answer (see read_squad's "untrainable").
  `n_truncated` counts examples whose question lost tokens to max_query_length.
  """
  max_tokens = max_seq_length - min(max_query_length, max_seq_length) - 3
  if max_tokens <= 0 or doc_stride <= 0:
    raise ValueError(
      f"max_seq_length={max_seq_length} leaves no room for the context after a "
      f"{max_query_length}-token query (or doc_stride={doc_stride} <= 0)"
    )
  cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
  rows: list[dict[str, np.ndarray]] = []
  metas: list[WindowMeta] = []
  n_used = n_truncated = 0
  doc_cache: dict[str, tuple] = {}
  for index, ex in enumerate(examples):
    if training and not ex.is_impossible and ex.answer_start is None:
      continue
    n_used += 1
    query = tokenizer.encode(ex.question)
    if len(query) > max_query_length:
      query, n_truncated = query[:max_query_length], n_truncated + 1
    if ex.context not in doc_cache:
      words, spans = doc_words(ex.context)
      pieces = tokenizer.encode_batch(words) if words else []
      ids = [i for p in pieces for i in p]
      tok_to_word = [w for w, p in enumerate(pieces) for _ in p]
      word_to_tok, n = [], 0
      for p in pieces:  # a word without tokens points at the next word's first token
        word_to_tok.append(n)
        n += len(p)
      # Questions come by paragraph: one context is enough to cache.
      doc_cache = {ex.context: (words, spans, ids, tok_to_word, word_to_tok)}
    words, spans, ids, tok_to_word, word_to_tok = doc_cache[ex.context]

    answer_span = None  # (first, last) doc sub-token of the training answer
    if ex.answer_start is not None and not ex.is_impossible:
      answer_span = _answer_tokens(ex, tokenizer, words, spans, ids, word_to_tok)

    # max_seq_length - len(query) - 3 tokens of context per window; at least one window.
    budget = max_seq_length - len(query) - 3
    windows = window_starts(len(ids), budget, doc_stride)
    best = max_context_window(windows, len(ids))
    offset = len(query) + 2
    for w, (start, length) in enumerate(windows):
      input_ids = np.array([cls_id, *query, sep_id, *ids[start : start + length], sep_id], np.int32)
      segment_ids = np.zeros(len(input_ids), np.int32)
      segment_ids[offset:] = 1
      token_to_word = np.full(len(input_ids), -1, np.int32)
      token_to_word[offset : offset + length] = tok_to_word[start : start + length]
      is_max = np.zeros(len(input_ids), bool)
      is_max[offset : offset + length] = best[start : start + length] == w
      s = e = 0
      if answer_span is not None and start <= answer_span[0] and answer_span[1] < start + length:
        s, e = answer_span[0] - start + offset, answer_span[1] - start + offset
      rows.append(
        {
          "input_ids": input_ids,
          "segment_ids": segment_ids,
          "start_positions": np.int32(s),
          "end_positions": np.int32(e),
          "example_index": np.int32(index),
        }
      )
      metas.append(WindowMeta(index, token_to_word, is_max, input_ids, offset, start))
  return Encoded(rows=rows, n_examples=n_used, n_truncated=n_truncated), metas


def _answer_tokens(ex: QAExample, tokenizer, words, spans, ids, word_to_tok):
  """First and last doc sub-token of the training answer, or None if it has no tokens."""
  end_char = ex.answer_start + len(ex.answers[0])
  start_word = next(w for w, (_, e) in enumerate(spans) if e > ex.answer_start)
  end_word = next(w for w in range(len(spans) - 1, -1, -1) if spans[w][0] < end_char)
  # Never train on a span that does not hold the answer text (run_squad's check).
  span_text = " ".join(words[start_word : end_word + 1])
  if "".join(ex.answers[0].split()) not in "".join(span_text.split()):
    raise ValueError(f"{ex.source}: answer {ex.answers[0]!r} is not in its span {span_text!r}")
  first = word_to_tok[start_word]
  last = (word_to_tok[end_word + 1] if end_word + 1 < len(words) else len(ids)) - 1
  if last < first:
    return None
  return _improve_answer_span(ids, first, last, tokenizer.encode(ex.answers[0]))


# --- Decoding -----------------------------------------------------------------------------


def _strip_spaces(text: str) -> tuple[str, list[int]]:
  kept = [i for i, c in enumerate(text) if not c.isspace()]
  return "".join(text[i] for i in kept), kept


def _final_text(pred_text: str, orig_text: str, lowercase: bool) -> str:
  """The part of `orig_text` that the detokenized prediction covers (run_squad's
  get_final_text): e.g. "(1895)" -> "1895" when the span's tokens were only "1895"."""
  tok_text = " ".join(tokenizer_lib.basic_tokenize(orig_text, lowercase))
  start = tok_text.find(pred_text)
  if start == -1:
    return orig_text
  end = start + len(pred_text) - 1
  orig_ns, orig_map = _strip_spaces(orig_text)
  tok_ns, tok_map = _strip_spaces(tok_text)
  if len(orig_ns) != len(tok_ns):  # normalisation changed lengths: no char alignment
    return orig_text
  tok_to_ns = {s: ns for ns, s in enumerate(tok_map)}
  if start not in tok_to_ns or end not in tok_to_ns:
    return orig_text
  return orig_text[orig_map[tok_to_ns[start]] : orig_map[tok_to_ns[end]] + 1]


def _span_text(ex_context, word_spans, meta: WindowMeta, s: int, e: int, tokenizer) -> str:
  first, last = word_spans[meta.token_to_word[s]][0], word_spans[meta.token_to_word[e]][1]
  orig_text = ex_context[first:last]
  if tokenizer is None or tokenizer.kind != "wordpiece":
    return orig_text
  pieces = [tokenizer.id_to_token(int(i)) for i in meta.input_ids[s : e + 1]]
  pred = " ".join(" ".join(pieces).replace(" ##", "").replace("##", "").split())
  return _final_text(pred, orig_text, tokenizer.lowercase)


def _top(values: np.ndarray, allowed: np.ndarray, n: int) -> np.ndarray:
  idx = np.flatnonzero(allowed)
  return idx[np.argsort(-values[idx], kind="stable")[:n]]


def decode(
  examples: Sequence[QAExample],
  metas: Sequence[WindowMeta],
  start_logits: Sequence[np.ndarray],
  end_logits: Sequence[np.ndarray],
  n_best: int = 20,
  max_answer_length: int = 30,
  version_2: bool = False,
  null_threshold: float = 0.0,
  *,
  tokenizer: tokenizer_lib.Tokenizer | None = None,
) -> tuple[dict[str, str], dict[str, float]]:
  """Predicted answer per question from per-row logits (rows as `metas`, padding allowed).

  Per example, over all its windows: the n_best starts (context tokens this window has max
  context for) and n_best ends (context tokens), every pair with end >= start and at most
  max_answer_length tokens; the best start + end logit wins. The text is the context from the
  start word to the end word, trimmed to the predicted tokens when `tokenizer` is given.
  version_2: null score = min over windows of start[CLS] + end[CLS]; diff = null score - best
  span score; the prediction is "" when diff > null_threshold (float("inf"): never). Returns
  (predictions, diffs); diffs is empty unless version_2. Examples without rows are left out.
  """
  if not len(metas) == len(start_logits) == len(end_logits):
    raise ValueError(
      f"decode: {len(metas)} windows but {len(start_logits)} start / {len(end_logits)} end logits"
    )
  by_example: dict[int, list[int]] = collections.defaultdict(list)
  for r, meta in enumerate(metas):
    by_example[meta.example_index].append(r)
  predictions: dict[str, str] = {}
  diffs: dict[str, float] = {}
  for index, rows in by_example.items():
    ex = examples[index]
    best = None  # (score, row, start, end)
    null = math.inf
    for r in rows:
      meta = metas[r]
      n = len(meta.token_to_word)
      start = np.asarray(start_logits[r], np.float64)[:n]
      end = np.asarray(end_logits[r], np.float64)[:n]
      null = min(null, start[0] + end[0])
      in_doc = meta.token_to_word >= 0
      s = _top(start, in_doc & meta.token_is_max_context, n_best)[:, None]
      e = _top(end, in_doc, n_best)[None, :]
      valid = (e >= s) & (e - s + 1 <= max_answer_length)
      if not valid.any():
        continue
      # A tie goes to the first pair in n-best order, as run_squad's stable sort.
      score = np.where(valid, start[s] + end[e], -np.inf)
      i, j = np.unravel_index(np.argmax(score), score.shape)
      if best is None or score[i, j] > best[0]:
        best = (float(score[i, j]), r, int(s[i, 0]), int(e[0, j]))
    text = ""
    if best is not None:
      _, words_spans = doc_words(ex.context)
      text = _span_text(ex.context, words_spans, metas[best[1]], best[2], best[3], tokenizer)
    if version_2:
      diff = null - (best[0] if best is not None else -math.inf)
      diffs[ex.qid] = float(diff)
      if diff > null_threshold:
        text = ""
    predictions[ex.qid] = text
  return predictions, diffs


def apply_null_threshold(
  predictions: dict[str, str], diffs: dict[str, float], threshold: float
) -> dict[str, str]:
  """SQuAD 2.0: "" (no answer) where the null-score diff is above `threshold`."""
  return {q: "" if diffs.get(q, -math.inf) > threshold else t for q, t in predictions.items()}


# --- The official metrics -----------------------------------------------------------------

_PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
  """Official SQuAD: lower case, drop punctuation, drop articles a/an/the, fix whitespace."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def _f1_v1(prediction: str, truth: str) -> float:
  pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
  same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 2 * precision * recall / (precision + recall)


def squad_v1_score(gold: dict[str, Sequence[str]], pred: dict[str, str]) -> dict[str, float]:
  """evaluate-v1.1.py: EM and F1 in percent, max over references, averaged over `gold`'s
  questions (a question without a prediction scores 0; extra predictions are ignored)."""
  em = f1 = 0.0
  for qid, truths in gold.items():
    if not truths:
      raise ValueError(f"squad_v1_score: question {qid} has no reference answer")
    if qid not in pred:
      continue
    p = pred[qid]
    em += max(float(normalize_answer(p) == normalize_answer(t)) for t in truths)
    f1 += max(_f1_v1(p, t) for t in truths)
  n = max(len(gold), 1)
  return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}


def _v2_scores(prediction: str, truths: Sequence[str]) -> tuple[float, float]:
  # evaluate-v2.0.py: no reference -> [""]; an empty side scores 1 only if both are empty.
  truths = [t for t in truths if normalize_answer(t)] or [""]
  pred = normalize_answer(prediction).split()
  em = f1 = 0.0
  for t in truths:
    gold = normalize_answer(t).split()
    em = max(em, float(pred == gold))
    if not pred or not gold:
      f1 = max(f1, float(pred == gold))
      continue
    same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if same:
      p, r = same / len(pred), same / len(gold)
      f1 = max(f1, 2 * p * r / (p + r))
  return em, f1


def squad_v2_score(gold: dict[str, Sequence[str]], pred: dict[str, str]) -> dict[str, float]:
  """evaluate-v2.0.py's EM and F1 (percent): questions without references expect ""."""
  em = f1 = 0.0
  for qid, truths in gold.items():
    if qid in pred:
      e, f = _v2_scores(pred[qid], truths)
      em, f1 = em + e, f1 + f
  n = max(len(gold), 1)
  return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}


def squad_v2_best_threshold(
  gold: dict[str, Sequence[str]], predictions: dict[str, str], diffs: dict[str, float]
) -> tuple[float, dict[str, float]]:
  """The no-answer threshold maximising dev F1, and EM/F1 at it (percent).

  `predictions` are the best non-null answers (decode with null_threshold=inf) and `diffs`
  the null-score diffs; a question gets "" when its diff > threshold. The threshold returned
  is the midpoint between the last diff switched to "" and the next (so it reproduces the
  choice on this data), max(diff) when no question should be null, min(diff) - 1 when all.
  """
  qids = list(gold)
  if not qids:
    raise ValueError("squad_v2_best_threshold: no questions")
  missing = [q for q in qids if q not in diffs]
  if missing:
    raise ValueError(f"squad_v2_best_threshold: no null-score diff for question {missing[0]}")
  d = np.array([diffs[q] for q in qids], np.float64)
  answer = np.array([_v2_scores(predictions.get(q, ""), gold[q]) for q in qids])  # [Q, 2]
  null = np.array([_v2_scores("", gold[q]) for q in qids])
  order = np.argsort(-d, kind="stable")
  d, answer, null = d[order], answer[order], null[order]
  # With the k largest diffs null: total = sum(null[:k]) + sum(answer[k:]).
  gain = np.concatenate([np.zeros((1, 2)), np.cumsum(null - answer, axis=0)]) + answer.sum(0)
  k_ok = np.ones(len(d) + 1, bool)
  k_ok[1:-1] = d[:-1] > d[1:]  # tied diffs cannot be split by a threshold
  k = int(np.argmax(np.where(k_ok, gain[:, 1], -np.inf)))
  if k == 0:
    threshold = float(d[0])
  elif k == len(d):
    threshold = float(d[-1]) - 1.0
  else:
    threshold = float((d[k - 1] + d[k]) / 2)
  n = len(qids)
  return threshold, {"exact_match": float(100 * gain[k, 0] / n), "f1": float(100 * gain[k, 1] / n)}


def write_predictions(path: str | os.PathLike, predictions: dict[str, str]) -> None:
  """The official predictions.json: {qid: answer text}."""
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(predictions, f, ensure_ascii=False, indent=1)
    f.write("\n")
  os.replace(tmp, path)
