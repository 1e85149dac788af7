"""The task-kind registry: every kind round-trips through the task.json check and HF's head
classes, and each kind's loss, count and predictions equal a numpy reference."""

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import hf_heads
from bert_jax.tasks import Task, kinds

LABELS = {"classification": ["neg", "pos", "mixed"], "tagging": ["O", "B-X", "I-X"]}


@pytest.mark.parametrize("kind", list(kinds.KINDS))
def test_kind_round_trips_through_task_json_and_hf(kind):
  task = {"kind": kind, "labels": LABELS.get(kind, []), "task": "t", "max_seq_length": None}
  assert hf_heads.check_task(task, "task.json") == task
  back = hf_heads.task_from_hf_config(hf_heads.task_to_hf_config(task), "config.json")
  assert back == task


def test_unknown_kind_is_one_line_naming_every_kind():
  with pytest.raises(ValueError, match=r"^x: unknown task kind 'ner' \(one of classification, "):
    kinds.get("ner", "x")
  with pytest.raises(ValueError, match="unknown task kind 'ner'"):
    Task("t", "ner", (), ("accuracy",))


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_losses_counts_and_predictions():
  rng = np.random.default_rng(0)
  w = np.array([1.0, 1.0, 0.0], np.float32)  # the last row pads the batch

  logits = rng.normal(size=(3, 3)).astype(np.float32)
  label = np.array([2, 0, 1], np.int32)
  loss, count = kinds.get("classification").loss(jnp.asarray(logits), {"weight": w, "label": label})
  want = -(_log_softmax(logits)[np.arange(3), label] * w).sum()
  np.testing.assert_allclose([loss, count], [want, 2.0], rtol=1e-6)
  pred = kinds.get("multiple_choice").predict(jnp.asarray(logits))["pred"]
  np.testing.assert_array_equal(pred, logits.argmax(-1))

  values = np.array([0.5, -1.0, 3.0], np.float32)
  loss, count = kinds.get("regression").loss(
    jnp.asarray(logits[:, :1]), {"weight": w, "label": values}
  )
  np.testing.assert_allclose(
    [loss, count], [((logits[:, 0] - values) ** 2 * w).sum(), 2.0], rtol=1e-6
  )

  tags = rng.normal(size=(3, 4, 3)).astype(np.float32)
  label_ids = np.array([[0, 1, -1, 2], [2, -1, -1, -1], [1, 1, 1, 1]], np.int32)
  batch = {"weight": w, "label_ids": label_ids}
  loss, count = kinds.get("tagging").loss(jnp.asarray(tags), batch)
  tw = (label_ids >= 0) * w[:, None]
  logp = np.take_along_axis(_log_softmax(tags), np.maximum(label_ids, 0)[..., None], -1)[..., 0]
  np.testing.assert_allclose([loss, count], [-(logp * tw).sum(), 4.0], rtol=1e-6)
  assert float(kinds.get("tagging").count(batch)) == 4.0

  spans = rng.normal(size=(3, 4, 2)).astype(np.float32)
  start, end = np.array([1, 3, 0], np.int32), np.array([2, 3, 0], np.int32)
  batch = {"weight": w, "start_positions": start, "end_positions": end}
  loss, count = kinds.get("span_qa").loss(jnp.asarray(spans), batch)
  ls = _log_softmax(spans[..., 0])[np.arange(3), start]
  le = _log_softmax(spans[..., 1])[np.arange(3), end]
  np.testing.assert_allclose([loss, count], [-(0.5 * (ls + le) * w).sum(), 2.0], rtol=1e-6)
  out = kinds.get("span_qa").predict(jnp.asarray(spans))
  np.testing.assert_array_equal(out["end_logits"], spans[..., 1])


def test_num_outputs():
  assert [kinds.get(k).num_outputs(LABELS.get(k, [])) for k in kinds.KINDS] == [3, 1, 3, 2, 1]
