"""The end-to-end half of tests/unit/test_finetune_torch.py (real processes; slow): see its
docstring."""

import json
import math
import pathlib
import statistics

import numpy as np
import pytest
from unit.test_finetune_torch import _checkpoint_dir, _run, _torch_python

from bert_jax.tokenizers import tokenizer as tokenizer_lib


def _tiny_checkpoint(python: str, tmp_path: pathlib.Path) -> pathlib.Path:
  """A random 1-layer HF BertModel with the bundled vocab."""
  ckpt = _checkpoint_dir(tmp_path)
  _run(
    python,
    "import sys, transformers as t\n"
    "c = t.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,"
    " num_attention_heads=2, intermediate_size=64)\n"
    "t.BertModel(c).save_pretrained(sys.argv[1])\n",
    str(ckpt),
  )
  return ckpt


@pytest.mark.slow
def test_tiny_run_writes_results_layout(tmp_path):
  python = _torch_python()
  ckpt = _tiny_checkpoint(python, tmp_path)
  data = tmp_path / "data"
  data.mkdir()
  words = ["good", "bad", "fine", "awful", "great", "poor"]
  for split, n in (("train", 10), ("dev", 6), ("test", 5)):
    lines = [json.dumps({"sentence": f"a {words[i % 6]} film", "label": i % 2}) for i in range(n)]
    (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
  out = tmp_path / "res.json"
  args = [f"--init={ckpt}", "--kind=classification", "--text_fields=sentence", f"--data_dir={data}"]
  args += ["--batch_size=4", "--epochs=2", "--seeds=2", "--threads=1", f"--output={out}"]
  _run(python, "import finetune_torch as f; f.main()", *args)
  r = json.loads(out.read_text())
  assert r["kind"] == "classification" and r["main_metric"] == "accuracy"
  assert r["labels"] == ["0", "1"] and r["data"]["train"] == 10
  assert r["recipe"] == {
    "lr": 3e-5,
    "batch_size": 4,
    "epochs": 2,
    "max_seq_length": 128,
    "seeds": 2,
  }
  # 3 steps an epoch (the last batch of 2 kept), 6 in all; warmup round(0.6) = 1 step.
  assert r["config"]["warmup_steps"] == 1
  assert [s["seed"] for s in r["seeds"]] == [0, 1]
  for s in r["seeds"]:
    assert s["best_epoch"] in (1, 2) and s["best_step"] == 3 * s["best_epoch"]
    assert [h["step"] for h in s["history"]] == [3, 6]
    assert s["dev"] == s["history"][s["best_epoch"] - 1]["dev"]
    assert s["test"]["accuracy"] in {k / 5 for k in range(6)}
  test = [s["test"]["accuracy"] for s in r["seeds"]]
  summary = r["test"]["accuracy"]
  assert summary["mean"] == pytest.approx(np.mean(test)) and summary["n"] == 2
  assert summary["std"] == pytest.approx(statistics.stdev(test))  # ddof=1
  assert summary["min"] == min(test) and summary["max"] == max(test)
  assert "torch" in r["versions"] and r["wall_s"] > 0 and not math.isnan(r["wall_s"])


@pytest.mark.slow
def test_span_qa_uses_bert_jax_windows(tmp_path):
  """QA runs on bert_jax's own windows and decoding (loaded without jax): the window counts
  equal tasks.squad's on the same file."""
  python = _torch_python()
  ckpt = _tiny_checkpoint(python, tmp_path)
  context = " ".join(f"Sentence {i} says the river is long and the city is old." for i in range(40))
  qas = [
    {"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
    for i, (q, a) in enumerate([("What is long?", "the river"), ("What is old?", "the city")])
  ]
  path = tmp_path / "squad.json"
  path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": qas}]}]}))
  out = tmp_path / "qa.json"
  args = [f"--init={ckpt}", "--kind=span_qa", f"--train={path}", f"--dev={path}", f"--test={path}"]
  args += [
    "--max_seq_length=64",
    "--doc_stride=32",
    "--max_query_length=16",
    "--batch_size=4",
    "--epochs=1",
    "--seeds=1",
  ]
  _run(python, "import finetune_torch as f; f.main()", *args, f"--output={out}")
  r = json.loads(out.read_text())
  from bert_jax.tasks import squad

  tok = tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())
  examples, _ = squad.read_squad([str(path)])
  train, _ = squad.encode_squad(examples, tok, 64, 32, 16, training=True)
  dev, _ = squad.encode_squad(examples, tok, 64, 32, 16, training=False)
  assert len(dev.rows) > 2  # several windows per question
  assert r["data"]["windows"] == {
    "train": len(train.rows),
    "dev": len(dev.rows),
    "test": len(dev.rows),
  }
  assert r["main_metric"] == "f1" and r["recipe"]["lr"] == 3e-5
  (seed,) = r["seeds"]
  assert set(seed["test"]) == {"exact_match", "f1"} and seed["test"] == seed["dev"]
  assert 0 <= seed["test"]["f1"] <= 100
