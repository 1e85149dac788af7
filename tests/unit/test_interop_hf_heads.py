"""bert_jax.interop.hf_heads: a fine-tuned model's task.json checks and HuggingFace's head
classes (their config keys and tensors), per task kind."""

import numpy as np
import pytest

from bert_jax.interop import hf_heads, hf_names
from bert_jax.model_config import BertConfig

CFG = BertConfig(
  vocab_size=40, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
  max_position_embeddings=16,
)  # fmt: skip


@pytest.mark.parametrize(
  "task,needle",
  [
    ([], "a task must be a JSON object, not list"),
    ({"kind": "classification", "labels": ["a"]}, "needs at least 2 labels, got 1"),
    ({"kind": "classification", "labels": ["a", "b", "a"]}, "label 'a' appears twice"),
    ({"kind": "span_qa", "labels": ["x"]}, "a span_qa task has no labels, got 1"),
    ({"kind": "tagging", "labels": "O,B"}, "'labels' must be a list of strings"),
    ({"kind": "ner"}, "unknown task kind 'ner'"),
  ],
)
def test_check_task_refuses_in_one_line_naming_the_file(task, needle):
  with pytest.raises(ValueError) as e:
    hf_heads.check_task(task, "d/task.json")
  msg = str(e.value)
  assert msg.startswith("d/task.json: ") and needle in msg and "\n" not in msg, msg


def test_hf_configs_read_as_tasks():
  assert hf_heads.task_from_hf_config({"architectures": ["BertForPreTraining"]}, "c") is None
  one = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "score"}}
  assert hf_heads.task_from_hf_config(one, "c")["kind"] == "regression"  # HF's own rule
  two = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "n", "1": "p"}}
  assert hf_heads.task_from_hf_config(two, "c") == {
    "kind": "classification", "labels": ["n", "p"], "task": None, "max_seq_length": None,
  }  # fmt: skip
  with pytest.raises(ValueError, match="^c: id2label keys must be 0..1"):
    hf_heads.task_from_hf_config({**two, "id2label": {"0": "n", "2": "p"}}, "c")
  qa = {"architectures": ["BertForQuestionAnswering"], "id2label": {str(i): "x" for i in range(3)}}
  with pytest.raises(ValueError, match="3 labels \\(its qa_outputs has 2\\)"):
    hf_heads.task_from_hf_config(qa, "c")


def _fine_tuned(kind: str, n: int, seed: int = 0):
  import jax

  from bert_jax import model as model_lib

  rng = np.random.default_rng(seed)
  bert = jax.tree.map(
    lambda x: rng.standard_normal(x.shape).astype(np.float32),
    model_lib.abstract_params(CFG, pretraining=False),
  )
  name = "qa_outputs" if kind == "span_qa" else "classifier"
  head = {name: {"kernel": rng.standard_normal((8, n)).astype(np.float32),
                 "bias": rng.standard_normal(n).astype(np.float32)}}  # fmt: skip
  return {"bert": bert, "head": head}


@pytest.mark.parametrize(
  "kind,labels,n", [("classification", ["a", "b", "c"], 3), ("tagging", ["O", "B"], 2),
                    ("span_qa", [], 2)],
)  # fmt: skip
def test_fine_tuned_tensors_round_trip_through_hf_names(kind, labels, n):
  task = {"kind": kind, "labels": labels, "task": None, "max_seq_length": None}
  params = _fine_tuned(kind, n)
  sd = hf_heads.params_to_hf_state_dict(params, CFG, task)
  name = next(iter(params["head"]))
  np.testing.assert_array_equal(sd[f"{name}.weight"], params["head"][name]["kernel"].T)
  # Tagging and span QA are HF classes without a pooler.
  assert ("bert.pooler.dense.weight" in sd) == (kind == "classification")
  back = hf_heads.hf_state_dict_to_params(sd, CFG, task, "m")
  np.testing.assert_array_equal(back["head"][name]["kernel"], params["head"][name]["kernel"])
  body = hf_names.params_to_hf_state_dict(back["bert"], CFG)
  want = hf_names.params_to_hf_state_dict(params["bert"], CFG)
  for k in body:
    if kind == "classification" or not k.startswith("pooler."):
      np.testing.assert_array_equal(body[k], want[k], err_msg=k)


def test_a_head_of_the_wrong_size_is_named():
  task = {"kind": "classification", "labels": ["a", "b", "c"], "task": None}
  sd = hf_heads.params_to_hf_state_dict(_fine_tuned("classification", 3), CFG, task)
  with pytest.raises(ValueError, match="^m: tensors classifier.weight \\(3, 8\\).* 2 labels"):
    hf_heads.hf_state_dict_to_params(sd, CFG, {**task, "labels": ["a", "b"]}, "m")
