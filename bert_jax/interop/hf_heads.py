"""Fine-tuned models: their task.json and HuggingFace's head classes.

A fine-tuned tree is {"bert": <BertModel tree>, "head": {...}} with a task dict
({"kind", "labels", "task", "max_seq_length"}, a params dir's task.json). In HuggingFace it is
BertForSequenceClassification (classification; regression with problem_type "regression"),
BertForTokenClassification (tagging), BertForQuestionAnswering (span_qa) or
BertForMultipleChoice, labels as id2label; HF kernels are [N, D], ours [D, N].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax import params_tree
from bert_jax.interop import hf_names
from bert_jax.model_config import BertConfig
from bert_jax.params_tree import Params
from bert_jax.trees import flatten

# What HF's configs may say of a sequence classifier's problem (it reads no other).
_PROBLEM_TYPES = (None, "regression", "single_label_classification")

# The file a fine-tuned params dir (hf_io) or a feature head dir (tasks.features) keeps its task
# in: {"kind", "labels", "task", "max_seq_length"} (`check_task` checks it).
TASK_FILE = "task.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Head:
  """A task kind's head as a checkpoint holds it: its output Dense and HuggingFace's class for
  it. The task kinds (bert_jax.tasks.kinds.Kind.hf) carry these, so the model, the export and the
  import read one description, and reading a checkpoint needs no fine-tuning code."""

  hf_class: str  # the HF class export writes and import reads
  name: str = "classifier"  # the head's output Dense, the same name in ours and HF's
  outputs: int | None = None  # the head's output size; None: one per label
  min_labels: int = 0  # the fewest labels a fine-tuned model's task.json may name
  hf_pooler: bool = True  # HF's class keeps BertModel's pooler (else add_pooling_layer=False)
  hf_problem_type: str | None = None  # config.json's problem_type when it must be written
  hf_id2label: tuple[str, ...] = ()  # the id2label export writes for an unlabelled kind
  hf_num_labels: int | None = None  # the num_labels HF's class needs of an unlabelled kind

  @property
  def labelled(self) -> bool:
    """Whether the outputs are named by the task's labels (classes or tags)."""
    return self.outputs is None

  def num_outputs(self, labels: Sequence[str]) -> int:
    return len(labels) if self.outputs is None else self.outputs


HEADS: dict[str, Head] = {
  "classification": Head(hf_class="BertForSequenceClassification", min_labels=2),
  "regression": Head(
    hf_class="BertForSequenceClassification",
    outputs=1,
    hf_problem_type="regression",
    hf_id2label=("LABEL_0",),  # HF's name for output 0
  ),
  "tagging": Head(hf_class="BertForTokenClassification", min_labels=1, hf_pooler=False),
  "span_qa": Head(
    hf_class="BertForQuestionAnswering",
    name="qa_outputs",
    outputs=2,
    hf_pooler=False,
    hf_num_labels=2,  # its qa_outputs size (HF's default id2label)
  ),
  # one score per choice, whatever HF's num_labels says
  "multiple_choice": Head(hf_class="BertForMultipleChoice", outputs=1),
}


def head_of(kind: Any, source: str = "task.kind") -> Head:
  """The head of task kind `kind`; anything else is one line naming `source`."""
  if not isinstance(kind, str) or kind not in HEADS:
    raise ValueError(f"{source}: unknown task kind {kind!r} (one of {', '.join(HEADS)})")
  return HEADS[kind]


def check_task(task: Any, source: str) -> dict[str, Any]:
  """A task.json dict checked (a known kind; labels: distinct strings, at least the kind's
  `min_labels` for classification and tagging, none for the other kinds); other keys are
  kept."""
  if not isinstance(task, Mapping):
    raise ValueError(f"{source}: a task must be a JSON object, not {type(task).__name__}")
  kind = task.get("kind")
  spec = head_of(kind, source)
  labels = task.get("labels", [])
  if not isinstance(labels, list | tuple) or not all(isinstance(x, str) for x in labels):
    raise ValueError(f"{source}: 'labels' must be a list of strings, not {labels!r}")
  if len(set(labels)) != len(labels):
    dup = next(x for x in labels if labels.count(x) > 1)
    raise ValueError(f"{source}: label {dup!r} appears twice in 'labels'")
  if spec.labelled and len(labels) < spec.min_labels:
    raise ValueError(
      f"{source}: a {kind} task needs at least {spec.min_labels} labels, got {len(labels)}"
    )
  if not spec.labelled and labels:
    raise ValueError(f"{source}: a {kind} task has no labels, got {len(labels)}")
  return {**task, "labels": list(labels)}


def check_head(
  head: Any, task: Mapping[str, Any], hidden_size: int, source: str, exact: bool = False
) -> None:
  """The head's output Dense has kernel [D, N] and bias [N], N = the kind's output count.

  exact: the head is that Dense alone (what HF's classes hold); otherwise other head layers
  (e.g. a BiLSTM under it) may sit beside it, and only N is checked when they do."""
  kind = task["kind"]
  spec = head_of(kind)
  arch, name = spec.hf_class, spec.name
  layer = head.get(name) if isinstance(head, Mapping) else None
  if not isinstance(layer, Mapping) or set(layer) != {"kernel", "bias"}:
    got = sorted(flatten(head)) if isinstance(head, Mapping) else type(head).__name__
    raise ValueError(f"{source}: a {kind} head needs head/{name}/{{kernel,bias}}, got {got}")
  others = sorted(k for k in head if k != name)
  if exact and others:
    raise ValueError(f"{source}: HF {arch} has no place for head/{others[0]} (head/{name} only)")
  n = spec.num_outputs(task["labels"])
  kernel, bias = tuple(np.shape(layer["kernel"])), tuple(np.shape(layer["bias"]))
  d = kernel[0] if others and kernel else hidden_size
  if kernel != (d, n) or bias != (n,):
    what = f"{n} labels" if spec.labelled else f"{n} output(s)"
    raise ValueError(
      f"{source}: head/{name} has kernel {kernel} and bias {bias}, but a {kind} task with "
      f"{what} needs ({d}, {n}) and ({n},)"
    )


def task_to_hf_config(task: Mapping[str, Any]) -> dict[str, Any]:
  """The config.json keys that make transformers build the task's head class."""
  spec = head_of(task["kind"])
  out: dict[str, Any] = {"architectures": [spec.hf_class]}
  if task.get("task"):
    out["finetuning_task"] = task["task"]
  labels = task["labels"] if spec.labelled else spec.hf_id2label
  if labels:
    out["id2label"] = {str(i): label for i, label in enumerate(labels)}
    out["label2id"] = {label: i for i, label in enumerate(labels)}
    out["num_labels"] = len(labels)
  if spec.hf_problem_type:
    out["problem_type"] = spec.hf_problem_type
  return out


def task_from_hf_config(hf: Mapping[str, Any], source: str) -> dict[str, Any] | None:
  """The task of an HF fine-tuned BERT (its architectures name one of the four head classes);
  None for BertModel / BertForPreTraining configs."""
  archs = hf.get("architectures") or []
  arch = next((a for a in archs if a in {h.hf_class for h in HEADS.values()}), None)
  if arch is None:
    return None
  id2label = hf.get("id2label") or {"0": "LABEL_0", "1": "LABEL_1"}  # HF's default
  try:
    labels = [str(id2label[str(i)]) for i in range(len(id2label))]
  except KeyError:
    raise ValueError(f"{source}: id2label keys must be 0..{len(id2label) - 1}") from None
  problem = hf.get("problem_type")
  if problem not in _PROBLEM_TYPES:
    raise ValueError(f"{source}: problem_type {problem!r} is not supported")
  # BertForSequenceClassification serves classification and regression; HF's own rule: one
  # label and no problem_type is regression.
  regression = problem == "regression" or (problem is None and len(labels) == 1)
  candidates = [(k, h) for k, h in HEADS.items() if h.hf_class == arch]
  kind, spec = next(
    (k, h)
    for k, h in candidates
    if len(candidates) == 1 or (h.hf_problem_type == "regression") == regression
  )
  if spec.hf_num_labels is not None and len(labels) != spec.hf_num_labels:
    raise ValueError(
      f"{source}: {arch} with {len(labels)} labels (its {spec.name} has {spec.hf_num_labels})"
    )
  task = {
    "kind": kind,
    "labels": labels if spec.labelled else [],
    "task": hf.get("finetuning_task"),
    "max_seq_length": None,  # HF keeps no record of it
  }
  return check_task(task, source)


def _head_to_hf(head: Params, task: Mapping[str, Any]) -> dict[str, np.ndarray]:
  name = head_of(task["kind"]).name
  kernel, bias = np.asarray(head[name]["kernel"]), np.asarray(head[name]["bias"])
  return {
    f"{name}.weight": np.ascontiguousarray(kernel.T).astype(np.float32),
    f"{name}.bias": np.ascontiguousarray(bias).astype(np.float32),
  }


def _fresh_pooler(cfg: BertConfig) -> dict[str, np.ndarray]:
  """A pooler for an HF token-level model, which has none: HF's init (normal with
  initializer_range, zero bias), seeded so a load is reproducible. Tagging and span QA never
  read it; it is there so the encoder is a whole BertModel."""
  d = cfg.hidden_size
  rng = np.random.default_rng(0)
  weight = (cfg.initializer_range * rng.standard_normal((d, d))).astype(np.float32)
  return {"bert.pooler.dense.weight": weight, "bert.pooler.dense.bias": np.zeros(d, np.float32)}


def hf_state_dict_to_params(
  sd: Mapping[str, np.ndarray], cfg: BertConfig, task: Mapping[str, Any], source: str
) -> Params:
  """An HF fine-tuned state dict -> {"bert": <BertModel tree>, "head": {...}}."""
  spec = head_of(task["kind"])
  arch, name = spec.hf_class, spec.name
  sd = dict(sd)
  head_sd = {}
  for suffix in ("weight", "bias"):
    key = f"{name}.{suffix}"
    if key not in sd:
      raise ValueError(f"{source}: missing tensor {key!r} (an HF {arch})")
    head_sd[suffix] = np.asarray(sd.pop(key), np.float32)
  n = spec.num_outputs(task["labels"])
  if head_sd["weight"].shape != (n, cfg.hidden_size) or head_sd["bias"].shape != (n,):
    what = f"{n} labels (id2label)" if spec.labelled else f"{n} output(s)"
    raise ValueError(
      f"{source}: tensors {name}.weight {tuple(head_sd['weight'].shape)} and {name}.bias "
      f"{tuple(head_sd['bias'].shape)}, but {what} need ({n}, {cfg.hidden_size}) and ({n},)"
    )
  if not spec.hf_pooler and not any(k.endswith("pooler.dense.weight") for k in sd):
    sd.update(_fresh_pooler(cfg))
  bert = hf_names.hf_state_dict_to_params(sd, cfg, pretraining=False, source=source)
  head = {name: {"kernel": np.ascontiguousarray(head_sd["weight"].T), "bias": head_sd["bias"]}}
  return {"bert": bert, "head": head}


def params_to_hf_state_dict(
  params: Any, cfg: BertConfig, task: Mapping[str, Any]
) -> dict[str, np.ndarray]:
  """A fine-tuned tree ({"bert", "head"}; either layout, boxed or not) -> the float32 tensors
  `save_pretrained` writes for its task's HF class: "bert.*" (no pooler for tagging and span QA)
  and classifier.* or qa_outputs.*."""
  params = params_tree.unbox_to_numpy(params)
  task = check_task(task, "task")
  check_head(params["head"], task, cfg.hidden_size, "params", exact=True)
  body = hf_names.params_to_hf_state_dict(params["bert"], cfg)
  sd = {f"bert.{k}": v for k, v in body.items()}
  if not head_of(task["kind"]).hf_pooler:  # HF builds it on BertModel without a pooler
    sd = {k: v for k, v in sd.items() if not k.startswith("bert.pooler.")}
  return {**sd, **_head_to_hf(params["head"], task)}
