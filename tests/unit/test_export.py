"""Fine-tuned models in and out of HuggingFace: a params dir with a task head (task.json) ->
BertForSequenceClassification / BertForTokenClassification / BertForQuestionAnswering /
BertForMultipleChoice -> back, with identical arrays; transformers loads each export with no
missing or unexpected keys and equal logits (live, only where torch + transformers import);
the loader on fine-tuned dirs; one-line errors.
"""

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import bert_jax
from bert_jax import model as model_lib
from bert_jax import params_tree
from bert_jax.interop import hf_io, loader
from bert_jax.model_config import BertConfig
from bert_jax.tokenizers import tokenizer as tokenizer_lib

LIVE = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
CFG = BertConfig(
  vocab_size=99,
  hidden_size=16,
  num_layers=2,
  num_heads=2,
  intermediate_size=32,
  max_position_embeddings=24,
)
TASKS = {
  "classification": {"kind": "classification", "labels": ["neg", "neutral", "pos"]},
  "regression": {"kind": "regression", "labels": []},
  "tagging": {"kind": "tagging", "labels": ["O", "B-PER", "I-PER", "B-LOC"]},
  "span_qa": {"kind": "span_qa", "labels": []},
  "multiple_choice": {"kind": "multiple_choice", "labels": []},
}
TASKS = {k: {**t, "task": f"toy_{k}", "max_seq_length": 16} for k, t in TASKS.items()}
ARCH = {
  "classification": "BertForSequenceClassification",
  "regression": "BertForSequenceClassification",
  "tagging": "BertForTokenClassification",
  "span_qa": "BertForQuestionAnswering",
  "multiple_choice": "BertForMultipleChoice",
}
OUTPUTS = {"classification": 3, "regression": 1, "tagging": 4, "span_qa": 2, "multiple_choice": 1}
HEAD = {k: "qa_outputs" if k == "span_qa" else "classifier" for k in TASKS}


def _one_line(excinfo, *needles):
  msg = str(excinfo.value)
  assert "\n" not in msg, msg
  for needle in needles:
    assert needle in msg, (needle, msg)


def _tokenizer():
  words = [f"w{i}" for i in range(CFG.vocab_size - len(tokenizer_lib.SPECIAL_TOKENS))]
  return tokenizer_lib.WordPieceTokenizer([*tokenizer_lib.SPECIAL_TOKENS, *words])


def _finetuned(kind, scan=False, seed=0, causal=False):
  """(cfg, {"bert": random BertModel params, "head": random head}) for a task kind."""
  cfg = dataclasses.replace(CFG, scan_layers=scan, causal=causal)
  rng = np.random.default_rng(seed)

  def draw(path, x):
    base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
    return (base + 0.2 * rng.standard_normal(x.shape)).astype(np.float32)

  bert = jax.tree_util.tree_map_with_path(draw, model_lib.abstract_params(cfg, pretraining=False))
  n = OUTPUTS[kind]
  layer = {"kernel": rng.standard_normal((cfg.hidden_size, n)), "bias": rng.standard_normal(n)}
  head = {HEAD[kind]: {k: (0.5 * v).astype(np.float32) for k, v in layer.items()}}
  return cfg, {"bert": bert, "head": head}


def _equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), b)


def _without_pooler(tree):
  return {k: v for k, v in params_tree.unstack_layers(tree).items() if k != "pooler"}


# --- params dir -> HF -> back -------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(TASKS))
def test_round_trip_params_dir_hf_params_dir(kind, tmp_path):
  scan = kind == "classification"  # one kind in the scanned layout
  cfg, params = _finetuned(kind, scan)
  task = TASKS[kind]
  hf_io.save_params_dir(tmp_path / "best", cfg, params, task=task)
  assert json.loads((tmp_path / "best" / "task.json").read_text()) == task
  flat = load_file(str(tmp_path / "best" / "params.safetensors"))
  assert f"head/{HEAD[kind]}/kernel" in flat and "bert/pooler/kernel" in flat
  # The loader: the encoder (BertModel tree), the head and the task beside it.
  ck = loader.load_checkpoint(tmp_path / "best")
  assert (ck.format, ck.has_heads, ck.task) == ("bert_jax", False, task)
  assert ck.config.scan_layers == scan
  _equal(ck.params, params["bert"])
  _equal(ck.head, params["head"])

  assert loader.convert(tmp_path / "best", tmp_path / "hf") == "hf"
  hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_cfg["architectures"] == [ARCH[kind]]
  assert hf_cfg["finetuning_task"] == f"toy_{kind}"
  labels = {
    "classification": ({"0": "neg", "1": "neutral", "2": "pos"}, 3),
    "regression": ({"0": "LABEL_0"}, 1),
    "tagging": ({"0": "O", "1": "B-PER", "2": "I-PER", "3": "B-LOC"}, 4),
  }
  if kind in labels:
    id2label, n = labels[kind]
    assert (hf_cfg["id2label"], hf_cfg["num_labels"]) == (id2label, n)
    assert hf_cfg["label2id"] == {v: int(k) for k, v in id2label.items()}
  else:  # HF's default 2 labels: qa_outputs' size; BertForMultipleChoice ignores it
    assert "id2label" not in hf_cfg and "num_labels" not in hf_cfg
  assert hf_cfg.get("problem_type") == ("regression" if kind == "regression" else None)
  sd = load_file(str(tmp_path / "hf" / "model.safetensors"))
  name = HEAD[kind]
  np.testing.assert_array_equal(sd[f"{name}.weight"], params["head"][name]["kernel"].T)
  np.testing.assert_array_equal(sd[f"{name}.bias"], params["head"][name]["bias"])
  no_pooler = kind in ("tagging", "span_qa")  # HF builds these with add_pooling_layer=False
  assert ("bert.pooler.dense.weight" in sd) == (not no_pooler)
  assert all(k.startswith("bert.") for k in sd if not k.startswith(f"{name}."))

  back = loader.load_checkpoint(tmp_path / "hf", scan_layers=scan)
  assert back.format == "hf" and back.task == {**task, "max_seq_length": None}
  _equal(back.head, params["head"])
  if no_pooler:  # a fresh pooler (HF init: zero bias), everything else identical
    _equal(_without_pooler(back.params), _without_pooler(params["bert"]))
    np.testing.assert_array_equal(back.params["pooler"]["bias"], np.zeros(cfg.hidden_size))
    assert 0.01 < np.std(back.params["pooler"]["kernel"]) < 0.03
  else:
    _equal(back.params, params["bert"])
  # HF -> params dir keeps head and labels.
  assert loader.convert(tmp_path / "hf", tmp_path / "again", scan_layers=scan) == "bert_jax"
  again = loader.load_checkpoint(tmp_path / "again")
  assert again.task == back.task
  _equal(again.params, back.params)
  _equal(again.head, params["head"])


def test_convert_cli_exports_a_best_dir(tmp_path):
  cfg, params = _finetuned("tagging")
  tok = _tokenizer()
  hf_io.save_params_dir(tmp_path / "best", cfg, params, tokenizer=tok, task=TASKS["tagging"])
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.getcwd()}
  cmd = [sys.executable, "-m", "bert_jax.convert", f"--src={tmp_path / 'best'}"]
  done = subprocess.run(
    [*cmd, f"--dst={tmp_path / 'hf'}"], capture_output=True, text=True, env=env, timeout=300
  )
  assert done.returncode == 0, done.stderr
  assert sorted(os.listdir(tmp_path / "hf")) == sorted(
    ["config.json", "model.safetensors", "special_tokens_map.json"]
    + ["tokenizer.json", "tokenizer_config.json", "vocab.txt"]
  )
  back = loader.load_checkpoint(tmp_path / "hf")
  assert back.task["labels"] == TASKS["tagging"]["labels"]
  assert back.tokenizer.fingerprint == tok.fingerprint
  _equal(back.head, params["head"])


# --- The loader on a fine-tuned dir -------------------------------------------------------------


def test_load_fine_tuned_dir_as_encoder_and_into_targets(tmp_path):
  cfg, params = _finetuned("classification")
  hf_io.save_params_dir(
    tmp_path / "best", cfg, params, tokenizer=_tokenizer(), task=TASKS["classification"]
  )
  m = bert_jax.load(tmp_path / "best")  # the notebook API: the encoder alone
  assert m.format == "bert_jax" and not m.has_heads
  _equal(m.params, params["bert"])
  hidden = m.embed(["w1 w2 w3"]).hidden[0]
  assert hidden.shape == (1, 5, cfg.hidden_size) and np.std(hidden) > 0.1

  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[1])
  abstract = lambda tree: jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree
  )
  load = lambda target: loader.load_checkpoint(tmp_path / "best", target=target).params
  body = load(abstract(model_lib.abstract_params(cfg, pretraining=False)))
  assert set(body) == {"embeddings", "encoder", "pooler"}
  _equal(body, params["bert"])
  assert set(load(abstract(model_lib.abstract_params(cfg)))) == {"bert"}  # no MLM/NSP heads
  # A fine-tuning target takes the head when its shapes match (continue fine-tuning) ...
  same = load(abstract({"bert": params["bert"], "head": params["head"]}))
  assert set(same) == {"bert", "head"}
  assert same["head"]["classifier"]["kernel"].devices() == {jax.devices()[1]}
  _equal(same, params)
  # ... and not for another label set (the caller's fresh head stays).
  _, other = _finetuned("tagging")
  assert set(load(abstract(other))) == {"bert"}


# --- transformers on the exports (live) ---------------------------------------------------------


def _ours(cfg, params, kind, ids, seg, mask):
  """Reference logits: BertModel, then the head in numpy."""
  rows = lambda a: a.reshape(-1, a.shape[-1])  # multiple choice: [B, C, L] -> [B*C, L]
  out = model_lib.BertModel(cfg).apply({"params": params["bert"]}, rows(ids), rows(seg), rows(mask))
  seq, pooled = np.asarray(out["sequence_output"]), np.asarray(out["pooled_output"])
  layer = params["head"][HEAD[kind]]
  dense = lambda x: x @ layer["kernel"] + layer["bias"]
  if kind in ("classification", "regression"):
    return {"logits": dense(pooled)}
  if kind == "tagging":
    return {"logits": dense(seq)}
  if kind == "span_qa":
    both = dense(seq)
    return {"start_logits": both[..., 0], "end_logits": both[..., 1]}
  return {"logits": dense(pooled).reshape(ids.shape[:2])}


@pytest.mark.skipif(not LIVE, reason="needs torch and transformers")
@pytest.mark.parametrize(
  "kind,causal", [(k, False) for k in TASKS] + [("span_qa", True)], ids=lambda x: str(x)
)
def test_transformers_loads_export_with_equal_logits(kind, causal, tmp_path):
  """Each export, and the LTR (causal) model's span QA head (is_decoder in HF)."""
  import torch
  import transformers

  cfg, params = _finetuned(kind, seed=1, causal=causal)
  hf_io.save_hf(tmp_path / "hf", cfg, params, tokenizer=_tokenizer(), task=TASKS[kind])
  model, info = getattr(transformers, ARCH[kind]).from_pretrained(
    tmp_path / "hf", output_loading_info=True, attn_implementation="eager"
  )
  assert {k: list(v) for k, v in info.items()} == {
    "missing_keys": [],
    "unexpected_keys": [],
    "mismatched_keys": [],
    "error_msgs": [],
  }
  model.eval()
  rng = np.random.default_rng(2)
  shape = (2, 3, 9) if kind == "multiple_choice" else (2, 9)
  ids = rng.integers(5, cfg.vocab_size, shape).astype(np.int32)
  seg = (np.arange(shape[-1]) >= 5).astype(np.int32) * np.ones(shape, np.int32)
  mask = np.ones(shape, np.int32)
  mask[1, ..., 6:] = 0  # padding in the second example
  t = lambda x: torch.from_numpy(x).long()
  with torch.no_grad():
    theirs = model(input_ids=t(ids), token_type_ids=t(seg), attention_mask=t(mask))
  ours = _ours(cfg, params, kind, ids, seg, mask)
  for key, want in ours.items():
    got = theirs[key].numpy()
    assert got.shape == want.shape, key
    assert np.ptp(want) > 0.05, key  # logits that vary: not trivially equal
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=key)
  # A directory transformers itself wrote imports as encoder + head + task.
  model.save_pretrained(tmp_path / "resaved")
  back = loader.load_checkpoint(tmp_path / "resaved", scan_layers=False)
  assert (back.task["kind"], back.task["labels"]) == (kind, TASKS[kind]["labels"])
  assert back.config.causal == causal
  _equal(back.head, params["head"])
  _equal(_without_pooler(back.params), _without_pooler(params["bert"]))


# --- one-line errors ------------------------------------------------------------------------------


def test_bad_fine_tuned_dirs(tmp_path):
  cfg, params = _finetuned("classification")
  task = TASKS["classification"]
  best = tmp_path / "best"
  hf_io.save_params_dir(best, cfg, params, task=task)

  def load_with_task(name, new_task):
    d = tmp_path / name
    shutil.copytree(best, d)
    if new_task is None:
      (d / "task.json").unlink()
    else:
      (d / "task.json").write_text(json.dumps(new_task))
    with pytest.raises(ValueError) as e:
      loader.load_checkpoint(d)
    return e, d

  e, d = load_with_task("missing", None)
  _one_line(e, str(d / "task.json"), "missing", "has a 'head', which needs its task")
  e, d = load_with_task("kind", {**task, "kind": "ner"})
  _one_line(e, str(d / "task.json"), "unknown task kind 'ner'", "classification, regression")
  e, d = load_with_task("labels", {**task, "labels": ["neg", "pos"]})
  _one_line(e, "head/classifier has kernel (16, 3)", "2 labels needs (16, 2) and (2,)")
  e, d = load_with_task("dup", {**task, "labels": ["neg", "pos", "neg"]})
  _one_line(e, str(d / "task.json"), "label 'neg' appears twice")
  e, d = load_with_task("qa_labels", {**task, "kind": "span_qa"})
  _one_line(e, "a span_qa task has no labels, got 3")
  # A task.json beside a pretraining params dir.
  hf_io.save_params_dir(tmp_path / "plain", cfg, params["bert"])
  (tmp_path / "plain" / "task.json").write_text(json.dumps(task))
  with pytest.raises(ValueError) as e:
    loader.load_checkpoint(tmp_path / "plain")
  _one_line(e, "a classification task, but", "has no head")

  # Writers: a head needs its task and the task a head; nothing is written on error.
  with pytest.raises(ValueError) as e:
    hf_io.save_params_dir(tmp_path / "no_task", cfg, params)
  _one_line(e, "task (the task= argument): missing")
  with pytest.raises(ValueError) as e:
    hf_io.save_hf(tmp_path / "no_task", cfg, params)
  _one_line(e, "params have a 'head' but no task was given")
  with pytest.raises(ValueError) as e:
    hf_io.save_hf(tmp_path / "no_head", cfg, params["bert"], task=task)
  _one_line(e, "a classification task was given but the params have no 'head'")
  with pytest.raises(ValueError) as e:
    hf_io.save_hf(tmp_path / "shape", cfg, params, task=TASKS["tagging"])
  _one_line(e, "head/classifier has kernel (16, 3)", "tagging task with 4 labels")
  # A head with more than HF's Dense (a BiLSTM under it) saves as a params dir, not to HF.
  extra = {"bert": params["bert"], "head": {**params["head"], "bilstm": {"w": np.ones(3)}}}
  hf_io.save_params_dir(tmp_path / "bilstm", cfg, extra, task=task)
  assert set(loader.load_checkpoint(tmp_path / "bilstm").head) == {"classifier", "bilstm"}
  with pytest.raises(ValueError) as e:
    hf_io.save_hf(tmp_path / "bilstm_hf", cfg, extra, task=task)
  _one_line(e, "HF BertForSequenceClassification has no place for head/bilstm")
  assert not any((tmp_path / n).exists() for n in ("no_task", "no_head", "shape", "bilstm_hf"))


def test_bad_hf_fine_tuned_dirs(tmp_path):
  cfg, params = _finetuned("classification")
  hf_io.save_hf(tmp_path / "hf", cfg, params, task=TASKS["classification"])

  def broken(name, config=None, drop=None):
    d = tmp_path / name
    shutil.copytree(tmp_path / "hf", d)
    hf_cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**hf_cfg, **(config or {})}))
    if drop:
      sd = load_file(str(d / "model.safetensors"))
      save_file({k: v for k, v in sd.items() if k != drop}, str(d / "model.safetensors"))
    with pytest.raises(ValueError) as e:
      loader.load_checkpoint(d)
    return e, d

  two = {"id2label": {"0": "neg", "1": "pos"}, "label2id": {"neg": 0, "pos": 1}, "num_labels": 2}
  e, d = broken("labels", two)
  _one_line(e, str(d / "model.safetensors"), "classifier.weight (3, 16)", "2 labels (id2label)")
  e, d = broken("multi", {"problem_type": "multi_label_classification"})
  _one_line(e, str(d / "config.json"), "problem_type 'multi_label_classification'")
  e, d = broken("ids", {"id2label": {"0": "a", "2": "b", "3": "c"}})
  _one_line(e, str(d / "config.json"), "id2label keys must be 0..2")
  e, d = broken("no_head", drop="classifier.bias")
  _one_line(e, "missing tensor 'classifier.bias'", "BertForSequenceClassification")
  e, d = broken("qa", {"architectures": ["BertForQuestionAnswering"]})
  _one_line(e, "BertForQuestionAnswering with 3 labels (its qa_outputs has 2)")
