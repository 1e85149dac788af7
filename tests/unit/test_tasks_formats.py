"""Tests for bert_jax.tasks.formats through the readers: every file format's bad input is one
line naming the file and the line (fixtures in fixtures/tasks)."""

import pathlib
import re

import pytest

from bert_jax.tasks import readers
from unit.test_tasks_readers import make_task


def _write(path: pathlib.Path, data: bytes | str) -> str:
  path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
  return str(path)


BAD_INPUTS = {
  # name: (file name, content, task fields, expected message start ({path} filled in))
  "empty": ("e.jsonl", "\n\n", {}, "{path}: the train split is empty"),
  "missing_field": (
    "m.jsonl",
    '{"sentence": "a", "label": 1}\n{"text": "b", "label": 0}\n',
    {},
    "{path}:2: missing field 'sentence' (the row has: text, label)",
  ),
  "malformed_json": (
    "j.jsonl",
    '{"sentence": "a", "label": 1}\n{"sentence": "b", "label": 0\n',
    {},
    "{path}:2: malformed JSON",
  ),
  "control_character": (  # json's own message ends in "at": not "at at column" (37.5)
    "cc.jsonl",
    '{"sentence": "a\tb", "label": 1}\n',
    {},
    "{path}:1: malformed JSON (Invalid control character at column 16)",
  ),
  "not_an_object": ("o.jsonl", '["a", 1]\n', {}, "{path}:1: a JSON line must be an object"),
  "column_count": (
    "c.tsv",
    "sentence\tlabel\na\t1\nb\t0\textra\n",
    {},
    "{path}:3: 3 columns, the header has 2 (sentence, label)",
  ),
  "regression_label": (
    "r.jsonl",
    '{"sentence": "a", "label": 1.5}\n{"sentence": "b", "label": "high"}\n',
    {"kind": "regression"},
    "{path}:2: regression label 'label'='high' is not a finite number",
  ),
  "encoding": (
    "u.csv",
    b"sentence,label\ncaf\xe9,1\n",
    {},
    "{path}:2: not UTF-8 (invalid continuation byte at byte 3 of the line): the file's encoding",
  ),
  "tags_length": (
    "t.jsonl",
    '{"tokens": ["a", "b"], "tags": ["O"]}\n',
    {"kind": "tagging"},
    "{path}:1: 2 tokens but 1 tags (one tag per word)",
  ),
  "conll_columns": (
    "n.conll",
    "a X O\nb O\n",
    {"kind": "tagging"},
    "{path}:2: 2 columns, earlier lines have 3",
  ),
  "text_type": (
    "x.jsonl",
    '{"sentence": ["a"], "label": 1}\n',
    {},
    "{path}:1: field 'sentence' must be a string, not list",
  ),
  "suffix": ("s.txt", "a\n", {}, "{path}: cannot tell the format from the suffix '.txt'"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_naming_file_and_line(case, tmp_path):
  name, content, fields, expected = BAD_INPUTS[case]
  path = _write(tmp_path / name, content)
  with pytest.raises(ValueError) as e:
    readers.read_split(make_task(train=path, **fields), "train")
  message = str(e.value)
  assert message.startswith(expected.format(path=path)), message
  assert "\n" not in message


def test_unseen_dev_label_names_file_and_line(tmp_path):
  train = _write(tmp_path / "train.jsonl", '{"sentence": "a", "label": "yes"}\n')
  dev = _write(
    tmp_path / "dev.jsonl",
    '{"sentence": "b", "label": "yes"}\n{"sentence": "c", "label": "maybe"}\n',
  )
  task = make_task(train=train, dev=dev)
  labels = readers.label_list(task, readers.read_split(task, "train"))
  with pytest.raises(
    ValueError, match=re.escape(f"{dev}:2: dev label 'maybe' is not one of the 1 labels (yes)")
  ):
    readers.check_labels(readers.read_split(task, "dev"), labels, "dev")
