"""references/finetune_torch.py, the PyTorch reference of fine-tuning: its inputs are bert_jax's
(tasks.encode) row for row, and a tiny run writes results.json's layout. Both need an
interpreter with torch and transformers ($BERT_JAX_PEER_PYTHON, or this one) and skip without."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from bert_jax.benchmark import peers
from bert_jax.tasks import encode, formats
from bert_jax.tokenizers import tokenizer as tokenizer_lib

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "references"


def _torch_python() -> str:
  python = os.environ.get("BERT_JAX_PEER_PYTHON", sys.executable)
  if not peers.peer_available(python)["torch"]:
    pytest.skip("no interpreter with torch and transformers (set BERT_JAX_PEER_PYTHON)")
  return python


def _checkpoint_dir(tmp_path: pathlib.Path) -> pathlib.Path:
  """A directory with the bundled (uncased) vocab, as an HF checkpoint has it."""
  d = tmp_path / "ckpt"
  d.mkdir()
  shutil.copy(tokenizer_lib.default_vocab_path(), d / "vocab.txt")
  (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  return d


def _run(python: str, code: str, *args: str) -> str:
  proc = subprocess.run(
    [python, "-c", code, *args], capture_output=True, text=True, timeout=600, cwd=SCRIPTS
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


PAIRS = [
  ("Hello, World! Ünïcödé café", "short one"),
  ("a b c d e f g h i j k l m n", "o p q r s t u v w"),  # both sides cut
  ("x", "unbelievably long words everywhere and here"),
]
SINGLES = [("The Quick brown fox's tale, re-told (again)",), ("ok",)]
TAGGED = [
  (["Empire", "State", "unbelievably", "\u200b", "NYC", "!"], ["B-a", "I-a", "O", "O", "B-b", "O"]),
  (["one", "two", "three", "four", "five", "six", "seven", "unbelievably"], ["O"] * 8),
  (["Hi"], ["O"]),
]


def test_inputs_equal_bert_jax_encode(tmp_path):
  python = _torch_python()
  ckpt = _checkpoint_dir(tmp_path)
  cases = {
    "pairs": ("classification", [{"texts": list(t), "label": "1"} for t in PAIRS], ["0", "1"], 12),
    "singles": (
      "classification",
      [{"texts": list(t), "label": "0"} for t in SINGLES],
      ["0", "1"],
      6,
    ),
    "tagged": (
      "tagging",
      [{"words": w, "tags": t} for w, t in TAGGED],
      ["B-a", "B-b", "I-a", "O"],
      8,
    ),
  }
  spec = tmp_path / "spec.json"
  spec.write_text(json.dumps({"dir": str(ckpt), "cases": cases}))
  code = (
    "import json, sys; import finetune_torch as f\n"
    "s = json.load(open(sys.argv[1])); tok = f.load_tokenizer(s['dir']); out = {}\n"
    "for name, (kind, exs, labels, n) in s['cases'].items():\n"
    "  rows, cut = f.encode(exs, kind, tok, n, labels); out[name] = [rows, cut]\n"
    "print(json.dumps(out))\n"
  )
  theirs = json.loads(_run(python, code, str(spec)).splitlines()[-1])
  tok = tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())
  for name, (kind, exs, labels, max_len) in cases.items():
    if kind == "tagging":
      ours_ex = [formats.TaggedExample(tuple(e["words"]), tuple(e["tags"]), "t") for e in exs]
    else:
      ours_ex = [formats.TextExample(tuple(e["texts"]), e["label"], "t") for e in exs]
    ours = encode.encode(ours_ex, kind, tok, max_len, labels)
    rows, n_cut = theirs[name]
    assert n_cut == ours.n_truncated > 0, name
    for o, t in zip(ours.rows, rows, strict=True):
      assert t["input_ids"] == o["input_ids"].tolist(), name
      assert t["segment_ids"] == o["segment_ids"].tolist(), name
      if kind == "tagging":
        assert [max(x, -1) for x in t["label_ids"]] == o["label_ids"].tolist()  # -100 ~ -1
        assert t["gold"] == [labels[i] for i in o["label_ids"] if i >= 0]
      else:
        assert t["label"] == int(o["label"])
