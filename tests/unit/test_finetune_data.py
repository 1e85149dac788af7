"""bert_jax.finetune.data: the GLUE presets read the GLUE layout (kinds, metrics, labels, unlabelled
test rows)."""

import numpy as np
import pytest

from bert_jax.finetune import data as ft_data
from unit._finetune_tasks import REPO, finetune_config


@pytest.mark.parametrize(
  "name,kind,main,labels",
  [
    ("stsb", "regression", "spearman", ()),
    ("mnli", "classification", "accuracy", ("contradiction", "entailment", "neutral")),
    ("cola", "classification", "mcc", ("0", "1")),
  ],
)
def test_glue_presets_read_the_glue_layout(name, kind, main, labels):
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
