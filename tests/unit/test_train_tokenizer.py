"""bert_jax.train_tokenizer, the command: it trains a WordPiece vocab and writes it; a bad flag is
one line."""

import gzip
import os
import pathlib
import subprocess
import sys

from bert_jax import config_lib
from bert_jax.tokenizers import tokenizer as tokenizer_lib

SAMPLE = pathlib.Path(config_lib.BUNDLED_CORPUS)


def test_train_wordpiece_cli(tmp_path):
  _write_corpus(tmp_path)
  out = tmp_path / "out" / "vocab.txt"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.train_tokenizer",
      f"--input={tmp_path}/*.txt*",
      "--kind=wordpiece",
      "--vocab_size=800",
      f"--output={out}",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  summary = proc.stdout.strip().splitlines()
  assert len(summary) == 1 and "wordpiece vocab_size=800" in summary[0]
  assert "1 non-UTF-8 lines skipped" in summary[0] and "2 file(s)" in summary[0]
  assert "b.txt.gz: skipped 1 line(s) that are not UTF-8" in proc.stderr
  assert sorted(os.listdir(out.parent)) == ["vocab.txt"]
  tokens = out.read_text(encoding="utf-8").splitlines()
  assert len(tokens) == 800 and tokens[:5] == list(tokenizer_lib.SPECIAL_TOKENS)
  assert "the" in tokens and any(t.startswith("##") for t in tokens)
  assert all(t == t.lower() for t in tokens[5:])  # lowercase by default for WordPiece
  tok = tokenizer_lib.load_tokenizer(out)
  ids = tok.encode("Alice was beginning to get very tired")
  assert tok.unk_id not in ids and tok.decode(ids) == "alice was beginning to get very tired"


def test_train_cli_error_is_one_line(tmp_path):
  out = tmp_path / "vocab.txt"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.train_tokenizer",
      f"--input={tmp_path}/missing*.txt",
      f"--output={out}",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 1
  assert proc.stderr.strip() == (
    f"train_tokenizer: error: --input: no file matches '{tmp_path}/missing*.txt'"
  )
  assert not out.exists()


def _write_corpus(directory: pathlib.Path) -> None:
  lines = SAMPLE.read_text(encoding="utf-8").splitlines()
  (directory / "a.txt").write_text("\n".join(lines[:2000]) + "\n", encoding="utf-8")
  body = ("\n".join(lines[2000:]) + "\n").encode() + b"caf\xe9 latin-1 line\n\n"
  with gzip.open(directory / "b.txt.gz", "wb") as f:
    f.write(body)
