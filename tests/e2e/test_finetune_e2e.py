"""The end-to-end half of tests/unit/test_finetune.py (real processes; slow): see its
docstring."""

import importlib.util
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from unit._finetune_tasks import (
  CLI_FIELDS,
  REPO,
  WORDS,
  _sentences,
  _spec,
  _splits,
  finetune_config,
  sentiment,
  tiny_config,
)

from bert_jax import finetune

_spec.loader.exec_module(finetune_config)


@pytest.mark.slow
def test_tagging_labels_first_subtoken(tmp_path):
  def make(rng, n):
    rows = []
    for words, _ in _sentences(rng, n, ["paris", "london"], p=1.0):
      tags = ["B-LOC" if w in ("paris", "london") else "O" for w in words]
      rows.append({"tokens": words, "tags": tags})
    return rows

  c = tiny_config("tagging", _splits(tmp_path, make))
  res = finetune.finetune(c, str(tmp_path / "run"))
  assert res["main_metric"] == "entity_f1"
  dev = res["seeds"][0]["dev"]
  assert dev["entity_f1"] > 0.8 and dev["token_accuracy"] > 0.9, dev


@pytest.mark.slow
def test_regression(tmp_path):
  def make(rng, n):
    rows = []
    for words, _ in _sentences(rng, n, ["good"], p=0.0):
      k = int(rng.integers(0, 4))
      words = words[:4] + ["good"] * k
      rows.append({"sentence": " ".join(words), "label": float(k)})
    return rows

  c = tiny_config("regression", _splits(tmp_path, make))
  res = finetune.finetune(c, str(tmp_path / "run"))
  assert res["main_metric"] == "pearson"
  assert res["seeds"][0]["dev"]["pearson"] > 0.8, res["seeds"][0]


@pytest.mark.slow
def test_preempted_run_resumes_to_the_same_results(tmp_path):
  """SIGTERM in the middle of seed 0 (dropout on): exit 75 after saving; the rerun finishes
  both seeds with results identical to an uninterrupted run."""
  paths = _splits(tmp_path, sentiment)
  fields = {**CLI_FIELDS, "task.train": paths[0], "task.dev": paths[1], "task.test": paths[2]}
  c = finetune_config.get_config("custom,seeds=2,size=tiny")
  for key, value in fields.items():
    section, name = key.split(".")
    c[section][name] = value
  full = finetune.finetune(c, str(tmp_path / "full"))

  flags = [f"--config.{k}={v}" for k, v in fields.items()]
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.finetune",
    "--config=configs/finetune.py:custom,seeds=2,size=tiny",
  ]
  cmd += [f"--workdir={tmp_path / 'cut'}", "--num_cpu_devices=8", *flags]
  env = {**os.environ, "PYTHONPATH": REPO}
  p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
  for line in p.stdout:
    if "step 10/" in line:
      p.send_signal(signal.SIGTERM)
      break
  p.stdout.read()
  assert p.wait() == 75
  assert not (tmp_path / "cut" / "results.json").exists()
  subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
  cut = json.load(open(tmp_path / "cut" / "results.json"))
  strip = lambda r: [{k: v for k, v in s.items() if k != "train_seconds"} for s in r["seeds"]]
  assert strip(full) == strip(cut)
  assert full["dev"] == cut["dev"] and full["test"] == cut["test"]


@pytest.mark.slow
def test_multiple_choice(tmp_path):
  def make(rng, n):
    rows = []
    for words, _ in _sentences(rng, n, ["x"], p=0.0):
      right = int(rng.integers(3))
      endings = [
        " ".join(rng.choice(WORDS, 3)) + (" good" if i == right else " bad") for i in range(3)
      ]
      rows.append({"context": " ".join(words[:4]), "endings": endings, "label": right})
    return rows

  c = tiny_config("multiple_choice", _splits(tmp_path, make), text_fields=("context", "endings"))
  res = finetune.finetune(c, str(tmp_path / "run"))
  assert res["main_metric"] == "accuracy"
  assert res["seeds"][0]["dev"]["accuracy"] > 0.8, res["seeds"][0]  # chance 1/3


@pytest.mark.slow
def test_span_qa_predictions_and_official_metric(tmp_path):
  """The answer is the one city in the context; predictions.json is the official format."""
  cities = ["paris", "london", "berlin", "madrid"]

  def make(rng, n, split):
    paragraphs = []
    for i, (words, k) in enumerate(_sentences(rng, n, cities, p=1.0)):
      context = " ".join(words)
      start = context.index(cities[k])
      qa = {
        "id": f"{split}{i}",
        "question": "which city ?",
        "answers": [{"text": cities[k], "answer_start": start}],
      }
      paragraphs.append({"context": context, "qas": [qa]})
    path = tmp_path / f"{split}.json"
    path.write_text(
      json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]})
    )
    return str(path)

  rng = np.random.default_rng(0)
  train_path, dev_path = (make(rng, n, s) for s, n in (("train", 192), ("dev", 48)))
  # One held-out file as dev and test (as the squadshifts preset): read and scored once.
  c = tiny_config("span_qa", (train_path, dev_path, dev_path))
  c.squad.doc_stride, c.squad.max_query_length = 8, 4
  wd = tmp_path / "run"
  res = finetune.finetune(c, str(wd))
  assert res["main_metric"] == "f1"
  dev = res["seeds"][0]["dev"]
  assert dev["f1"] > 80 and dev["exact_match"] > 80, dev  # percent, as the official script
  assert res["seeds"][0]["test"] == dev and res["data"]["test"] == 48
  preds = json.load(open(wd / "seed_0" / "predictions_dev.json"))
  assert len(preds) == 48 and all(isinstance(v, str) for v in preds.values())
  assert json.load(open(wd / "seed_0" / "predictions_test.json")) == preds


@pytest.mark.slow
def test_table5_pretrained_checkpoints_fine_tune(tmp_path, tiny_data_dir):
  """Table 5's rows pretrained by bert_jax (a few steps each), then fine-tuned from their
  workdirs: the LTR model stays causal, and the report lays the three rows out."""
  from bert_jax import report, train

  spec = importlib.util.spec_from_file_location(
    "table5", f"{REPO}/experiments/table5_pretraining_tasks.py"
  )
  table5 = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(table5)
  paths = _splits(tmp_path, sentiment)
  scores = {}
  for row in ("mlm_nsp", "mlm", "ltr"):
    c = table5.get_config(f"task={row},scale=cpu")
    c.model.update(vocab_size=30522, hidden_size=64, intermediate_size=128, num_layers=2)
    c.model.update(num_heads=2, max_position_embeddings=64, dtype="float32")
    c.data.dir, c.data.input, c.data.train_vocab_size = tiny_data_dir, "", 0
    c.data.max_seq_length, c.data.batch_size, c.masking.max_predictions = 64, 8, 10
    c.opt.total_steps, c.opt.warmup_steps = 4, 1
    c.ckpt.every_steps, c.ckpt.async_save = 4, False
    c.eval.every_steps, c.eval.max_batches, c.log.every_steps, c.log.fill_mask = 0, 1, 2, ()
    point = tmp_path / "root" / f"task={row}"
    train.train_and_evaluate(c, str(point))
    f = tiny_config("classification", paths)
    f.init = str(point)
    res = finetune.finetune(f, str(point / "finetune" / "sentiment"))
    best = json.load(
      open(point / "finetune" / "sentiment" / "seed_0" / "best" / "bert_config.json")
    )
    assert best["causal"] == (row == "ltr")
    scores[row] = res["seeds"][0]["dev"]["accuracy"]
  assert all(s > 0.8 for s in scores.values()), scores  # each row learns the task
  text, _ = report.report(str(tmp_path / "root"))
  for row in ("mlm_nsp", "mlm", "ltr"):
    assert row in text


@pytest.mark.slow
def test_classification_seeds_results_and_rerun(tmp_path):
  c = tiny_config("classification", _splits(tmp_path, sentiment))
  c.seeds = 2
  wd = str(tmp_path / "run")
  res = finetune.finetune(c, wd)
  assert res["labels"] == ["neg", "pos"]
  assert res["data"]["train"] == 192 and res["data"]["dev"] == 64
  assert [s["seed"] for s in res["seeds"]] == [0, 1]
  for s in res["seeds"]:
    assert s["dev"]["accuracy"] > 0.85, s  # chance is ~0.5
    assert set(s["test"]) == {"accuracy", "loss"}
  acc = [s["dev"]["accuracy"] for s in res["seeds"]]
  assert res["dev"]["accuracy"]["mean"] == pytest.approx(np.mean(acc))
  assert res["dev"]["accuracy"]["std"] == pytest.approx(np.std(acc, ddof=1))
  assert res["dev"]["accuracy"]["n"] == 2
  with open(os.path.join(wd, "results.json")) as f:
    assert json.load(f)["seeds"] == res["seeds"]
  task = json.load(open(os.path.join(wd, "seed_0", "best", "task.json")))
  assert task["kind"] == "classification" and task["labels"] == ["neg", "pos"]
  # The seeds differ in head init and data order.
  assert res["seeds"][0]["dev"]["loss"] != res["seeds"][1]["dev"]["loss"]
  # A rerun resumes a finished run: nothing retrains, the results are the same.
  again = finetune.finetune(c, wd)
  assert again["seeds"] == res["seeds"]
  c2 = tiny_config("classification", (c.task.train, c.task.dev, c.task.test))
  c2.opt.lr = 1e-3
  with pytest.raises(ValueError, match=r"another config \(opt.lr"):
    finetune.finetune(c2, wd)
  # Checkpoints without their config.json are refused, not resumed under any config.
  os.remove(os.path.join(wd, "config.json"))
  with pytest.raises(ValueError, match=r"seed checkpoints \(seed_0/checkpoints/.*no config"):
    finetune.finetune(c2, wd)
  assert not os.path.exists(os.path.join(wd, "config.json"))
