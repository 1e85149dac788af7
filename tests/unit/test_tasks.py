"""bert_jax.tasks: a Task is a kind with its labels and metrics (a labelled kind needs two
labels; the first metric is the one dev selects on); its model, losses and scores are its
kind's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import model_config
from bert_jax.tasks import Task, kinds


def test_a_labelled_kind_needs_two_labels_and_the_first_metric_is_the_main_one():
  with pytest.raises(ValueError) as e:
    Task("t", "classification", ("a",), ("accuracy",))
  assert str(e.value) == "task t: a classification task needs >= 2 labels: ('a',)"
  reg = Task("r", "regression", (), ("spearman", "pearson"))
  assert reg.main_metric == "spearman" and reg.num_outputs == 1 and reg.spec.value_label
  assert Task("c", "classification", ("a", "b", "c"), ("accuracy",)).num_outputs == 3
  assert Task("q", "span_qa", (), ("f1",)).num_outputs == 2  # start and end logits
  assert Task("m", "multiple_choice", (), ("accuracy",)).num_outputs == 1  # a score per choice


def test_model_losses_and_scores_are_the_kinds():
  task = Task("t", "classification", ("a", "b", "c"), ("accuracy",))
  cfg = model_config.config_for_size("tiny", vocab_size=64, max_position_embeddings=16)
  model = task.model(cfg)
  assert (model.kind, model.num_outputs, model.bilstm) == ("classification", 3, False)
  ids = jax.random.randint(jax.random.key(0), (2, 8), 1, 64)
  params = model.init({"params": jax.random.key(1)}, ids, 0 * ids, jnp.ones_like(ids))
  logits = model.apply(params, ids, 0 * ids, jnp.ones_like(ids))
  assert logits.shape == (2, 3) and logits.dtype == jnp.float32
  batch = {"label": np.array([2, 0], np.int32), "weight": np.array([1.0, 0.0], np.float32)}
  loss, count = task.losses(logits, batch)
  want = -jax.nn.log_softmax(logits[0])[2]  # the padding row (weight 0) does not count
  np.testing.assert_allclose([loss, count], [want, 1.0], rtol=1e-6)
  assert float(task.count(batch)) == 1.0
  np.testing.assert_array_equal(task.predict(logits)["pred"], np.argmax(logits, -1))
  rows = [{"label": np.int32(y)} for y in (0, 1, 1)]
  preds = {"pred": [np.int32(p) for p in (0, 2, 1)]}
  assert task.score(preds, rows) == {"accuracy": pytest.approx(2 / 3)}
  reg = Task("r", "regression", (), ("pearson", "spearman"))
  got = reg.score({"pred": [np.float32(v) for v in (1, 2, 3)]},
                  [{"label": np.float32(v)} for v in (1, 2.5, 2.7)])  # fmt: skip
  assert got["pearson"] == pytest.approx(np.corrcoef([1, 2, 3], [1, 2.5, 2.7])[0, 1], rel=1e-5)
  assert got["spearman"] == pytest.approx(1.0)
  assert kinds.get("classification") is task.spec
