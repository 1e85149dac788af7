"""The file formats a task split comes in, read into examples: JSON lines, CSV and TSV (GLUE's
TSVs without quoting), CoNLL columns. Every error a user's data can cause is one line naming
the file and line (`path:line: what is wrong`). `readers` chooses the format and the fields.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

from bert_jax.tasks import kinds


@dataclasses.dataclass(frozen=True)
class TextExample:
  """Classification / regression / multiple-choice text (texts: one, a pair, or context+endings)."""

  texts: tuple[str, ...]
  label: str | float | None  # class name; float for regression; None when unlabelled
  source: str  # "path:line"


@dataclasses.dataclass(frozen=True)
class TaggedExample:
  """A sentence of words with one tag per word (tags None when unlabelled)."""

  words: tuple[str, ...]
  tags: tuple[str, ...] | None
  source: str


Example = TextExample | TaggedExample


def lines(path: str) -> Iterator[tuple[int, str]]:
  """(line number, text) of a UTF-8 (optionally gzip) file, decoded strictly line by line."""
  try:
    f = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no such file") from None
  with f:
    try:
      for lineno, raw in enumerate(f, 1):
        try:
          text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise ValueError(
            f"{path}:{lineno}: not UTF-8 ({e.reason} at byte {e.start} of the line): the file's "
            "encoding is wrong; convert it to UTF-8"
          ) from None
        if lineno == 1 and text.startswith("\ufeff"):
          text = text[1:]  # a byte-order mark (spreadsheet exports) is not part of the data
        yield lineno, text
    except (gzip.BadGzipFile, EOFError) as e:
      raise ValueError(f"{path}: not a readable gzip file ({e})") from None


def jsonl_rows(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
  for lineno, line in lines(path):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      # json's own message may end in "at" ("Invalid control character ... at").
      msg = e.msg.removesuffix(" at")
      raise ValueError(f"{path}:{lineno}: malformed JSON ({msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
      raise ValueError(f"{path}:{lineno}: a JSON line must be an object, not {type(obj).__name__}")
    yield f"{path}:{lineno}", obj


def table_rows(
  path: str, fmt: str, fieldnames: Sequence[str] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
  """Rows of a CSV / TSV file as dicts keyed by the header (or by `fieldnames`: no header)."""
  read = [0]  # lines handed to the csv module so far

  def text() -> Iterator[str]:
    for lineno, line in lines(path):
      read[0] = lineno
      yield line

  # GLUE's TSVs hold bare quote characters inside sentences: TSV is read without quoting.
  if fmt == "tsv":
    reader = csv.reader(text(), delimiter="\t", quoting=csv.QUOTE_NONE)
  else:
    reader = csv.reader(text())
  header = list(fieldnames) if fieldnames is not None else None
  try:
    while True:
      lineno = read[0] + 1  # a quoted CSV field may span lines: name the row's first
      row = next(reader, None)
      if row is None:
        break
      if not row or (len(row) == 1 and not row[0].strip()):
        continue
      if header is None:
        header = row
        continue
      if len(row) != len(header):
        raise ValueError(
          f"{path}:{lineno}: {len(row)} columns, the header has {len(header)} ({', '.join(header)})"
        )
      yield f"{path}:{lineno}", dict(zip(header, row, strict=True))
  except csv.Error as e:
    raise ValueError(f"{path}:{read[0]}: malformed {fmt} ({e})") from None


def _field(obj: dict[str, Any], name: str, source: str) -> Any:
  if name not in obj or obj[name] is None:
    present = ", ".join(map(str, list(obj)[:12]))
    raise ValueError(f"{source}: missing field {name!r} (the row has: {present})")
  return obj[name]


def _text(obj: dict[str, Any], name: str, source: str) -> str:
  value = _field(obj, name, source)
  if not isinstance(value, str):
    raise ValueError(f"{source}: field {name!r} must be a string, not {type(value).__name__}")
  return value


def _label(value: Any, spec: kinds.Kind, name: str, source: str) -> str | float:
  if spec.value_label:
    try:
      out = float(value)
    except (TypeError, ValueError):
      out = math.nan
    if isinstance(value, bool) or not math.isfinite(out):
      raise ValueError(f"{source}: regression label {name!r}={value!r} is not a finite number")
    return out
  if isinstance(value, bool) and not spec.choices:
    # JSON true/false are the classes 1/0 (as in Python, true == 1): a column that mixes them
    # with 0/1 holds two classes, not four ("0", "1", "False", "True").
    return str(int(value))
  if isinstance(value, bool | int | str):
    return str(value)
  if isinstance(value, float) and value.is_integer():
    return str(int(value))
  raise ValueError(
    f"{source}: label {name!r}={value!r} must be a class name (string) or an integer"
  )


class _Labelled:
  """Whether each row of a split has its label: train and dev rows must (a missing one is the
  `_field` error naming the row); a test split has labels in every row or in none (an absent
  or null field), and a row that differs from the first is one line naming both."""

  def __init__(self, split: str, field: str):
    self.split, self.field = split, field
    self.first: tuple[str, bool] | None = None

  def __call__(self, obj: dict[str, Any], source: str) -> bool:
    if self.split != "test":
      return True
    has = obj.get(self.field) is not None
    if self.first is None:
      self.first = (source, has)
    elif has != self.first[1]:
      first, had = self.first
      raise ValueError(
        f"{source}: this test row {'has' if has else 'has no'} {self.field!r} but {first} "
        f"{'has one' if had else 'has none'}: a test split is labelled in every row (scored) or "
        "in none (predictions only)"
      )
    return has


def text_examples(
  rows: Iterator[tuple[str, dict[str, Any]]],
  fields: tuple[str, ...],
  label_field: str,
  spec: kinds.Kind,
  split: str,
  limit: int,
) -> list[TextExample]:
  """TextExamples from dict rows. Train and dev need labels; a test split may have none (as
  GLUE's test files: it gets predictions, no metrics), but not some (`_labelled`)."""
  if spec.choices:
    if not fields:
      raise ValueError("task.text_fields must name the context field and the ending field(s)")
  elif len(fields) not in (1, 2):
    raise ValueError(f"task.text_fields must name one or two fields, not {fields!r}")
  out: list[TextExample] = []
  labelled = _Labelled(split, label_field)
  for source, obj in rows:
    if len(out) >= limit:
      break
    has_label = labelled(obj, source)
    if spec.choices and len(fields) == 2 and isinstance(obj.get(fields[1]), list):
      endings = _field(obj, fields[1], source)
      if not all(isinstance(e, str) for e in endings):
        raise ValueError(f"{source}: field {fields[1]!r} must be a list of strings")
      texts = (_text(obj, fields[0], source), *endings)
    else:
      texts = tuple(_text(obj, f, source) for f in fields)
    label = (
      _label(_field(obj, label_field, source), spec, label_field, source) if has_label else None
    )
    out.append(TextExample(texts, label, source))
  return out


def tagged_jsonl(
  path: str, split: str, limit: int, tokens_field: str, tags_field: str
) -> list[TaggedExample]:
  """Tagged sentences from JSON lines: a list of words and a list of tags (one per word)."""
  out: list[TaggedExample] = []
  labelled = _Labelled(split, tags_field)
  for source, obj in jsonl_rows(path):
    if len(out) >= limit:
      break
    has_tags = labelled(obj, source)
    words = _string_list(obj, tokens_field, source)
    tags = _string_list(obj, tags_field, source) if has_tags else None
    if tags is not None and len(tags) != len(words):
      raise ValueError(
        f"{source}: {len(words)} {tokens_field} but {len(tags)} {tags_field} (one tag per word)"
      )
    out.append(TaggedExample(words, tags, source))
  return out


def _string_list(obj: dict[str, Any], name: str, source: str) -> tuple[str, ...]:
  value = _field(obj, name, source)
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    raise ValueError(f"{source}: field {name!r} must be a list of strings")
  return tuple(value)


def conll(path: str, split: str, limit: int, word_col: int, tag_col: int) -> list[TaggedExample]:
  """Whitespace-separated columns, one word a line, a blank line between sentences;
  "-DOCSTART-" lines are skipped. A test file with a single column is unlabelled."""
  out: list[TaggedExample] = []
  words: list[str] = []
  tags: list[str] = []
  start = 0
  ncols = None

  def flush() -> None:
    if words:
      labelled = not (split == "test" and ncols == 1)
      out.append(TaggedExample(tuple(words), tuple(tags) if labelled else None, f"{path}:{start}"))
      words.clear()
      tags.clear()

  for lineno, line in lines(path):
    cols = line.split()
    if not cols:
      flush()
      if len(out) >= limit:
        break
      continue
    if cols[0] == "-DOCSTART-":
      continue
    if ncols is None:
      ncols = len(cols)
      if not (split == "test" and ncols == 1):
        for c in (word_col, tag_col):
          if not -ncols <= c < ncols:
            raise ValueError(
              f"{path}:{lineno}: {ncols} columns; task.word_column={word_col} / "
              f"task.tag_column={tag_col} is out of range"
            )
    elif len(cols) != ncols:
      raise ValueError(f"{path}:{lineno}: {len(cols)} columns, earlier lines have {ncols}")
    if not words:
      start = lineno
    words.append(cols[word_col])
    tags.append(cols[tag_col])
  if len(out) < limit:
    flush()
  return out[:limit]
