"""bert_jax.finetune.data: the GLUE presets read the GLUE layout (kinds, metrics, labels, unlabelled
test rows)."""

import re

import numpy as np
import pytest

from bert_jax.finetune import data as ft_data
from unit._finetune_tasks import REPO, finetune_config


@pytest.mark.parametrize(
  "name,kind,main,labels,read",
  [
    ("stsb", "regression", "spearman", (), "train 2, dev 1, test 1"),
    (
      "mnli",
      "classification",
      "accuracy",
      ("contradiction", "entailment", "neutral"),
      "train 4, dev 1, test 1",
    ),
    ("cola", "classification", "mcc", ("0", "1"), "train 3, dev 2, test 2"),
  ],
)
def test_glue_presets_read_the_glue_layout(name, kind, main, labels, read, capsys):
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  c = finetune_config.get_config(f"{name},glue_dir={REPO}/tests/fixtures/tasks/glue")
  tok = tokenizer_lib.WordPieceTokenizer.from_file(tokenizer_lib.default_vocab_path())
  task, data = ft_data.load_task_data(c, tok)
  assert (task.kind, task.main_metric) == (kind, main)
  assert set(task.labels) == set(labels)
  assert data["train"][1].rows and data["dev"][1].rows
  test_rows = data["test"][1].rows
  key = "label"
  unlabelled = [r[key] for r in test_rows]
  assert all((np.isnan(v) if kind == "regression" else v == -1) for v in unlabelled)
  # One line says what was read: each split's examples, and the time.
  line = capsys.readouterr().out.splitlines()[-1]
  assert re.fullmatch(rf"{name} \({kind}\): {read}; encoded in \d+\.\ds", line), line


def test_the_line_of_what_was_read_counts_truncated_examples(capsys):
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  c = finetune_config.get_config(f"mnli,glue_dir={REPO}/tests/fixtures/tasks/glue")
  c.data.max_seq_length = 16
  tok = tokenizer_lib.WordPieceTokenizer.from_file(tokenizer_lib.default_vocab_path())
  _, data = ft_data.load_task_data(c, tok)
  assert (data["train"].encoded.n_truncated, data["test"].encoded.n_truncated) == (3, 1)
  line = capsys.readouterr().out.splitlines()[-1]
  assert line.startswith(
    "mnli (classification): train 4 (3 truncated), dev 1, test 1 (1 truncated); encoded in "
  ), line
