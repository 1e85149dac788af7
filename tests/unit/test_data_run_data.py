"""bert_jax.data.run_data: the data a trainer builds for itself is keyed by content, not path."""

import itertools
import json

import pytest

from bert_jax import config_lib
from bert_jax.data import corpus, run_data
from bert_jax.data import input_pipeline as ip
from bert_jax.tokenizers.tokenizer import load_tokenizer
from unit._corpora import _write_corpus


def _trainer_config(corpus_path, **over):
  """A training config whose data the trainer builds itself (as configs/local.py), tiny."""
  from bert_jax import config_lib

  c = config_lib.base_config("tiny")
  c.data.input = str(corpus_path)
  c.model.vocab_size = c.data.train_vocab_size = 200
  c.data.max_seq_length = 32
  c.masking.max_predictions = 5
  c.data.dupe_factor = 1
  c.data.eval_fraction = 0.1
  c.objective.nsp = False
  for k, v in over.items():
    c[k.split(".")[0]][k.split(".")[1]] = v
  return c


def _snapshot(root):
  return {
    str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
    for p in sorted(root.rglob("*"))
    if p.is_file()
  }


def test_built_data_is_keyed_by_content_not_path(tmp_path):
  """A reinstall moves the bundled corpus: the same bytes elsewhere reuse <workdir>/data
  untouched; one changed byte (or option) is refused in one line naming the input."""
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  a, b = tmp_path / "a" / "corpus.txt", tmp_path / "b" / "corpus.txt"
  with open(config_lib.BUNDLED_CORPUS) as f:
    lines = [ln.strip() for ln in itertools.islice(f, 300) if ln.strip()]
  _write_corpus(a, [lines[i : i + 10] for i in range(0, len(lines), 10)])
  b.write_bytes(a.read_bytes())
  wd = tmp_path / "wd"
  data_dir = run_data.ensure_built(_trainer_config(a), str(wd))
  assert data_dir == str(wd / "data")
  meta = ip.read_metadata(data_dir)
  assert meta["source"]["input_sha256"] == corpus.content_sha256([str(a)])
  assert meta["tokenizer"]["fingerprint"] == load_tokenizer(str(wd / "vocab.txt")).fingerprint
  before = _snapshot(wd)
  assert "vocab.txt" in before and "data/metadata.json" in before

  assert run_data.ensure_built(_trainer_config(b), str(wd)) == data_dir
  assert _snapshot(wd) == before  # reused: nothing rebuilt or rewritten

  text = b.read_bytes()
  i = text.index(b"Rabbit")
  b.write_bytes(text[:i] + b"H" + text[i + 1 :])  # "Rabbit" -> "Habbit": one byte
  old, new = corpus.content_sha256([str(a)])[:12], corpus.content_sha256([str(b)])[:12]
  with pytest.raises(ValueError) as e:
    run_data.ensure_built(_trainer_config(b), str(wd))
  assert str(e.value) == (
    f"{data_dir} was built from other text: the text of {b} (sha256) {old!r} -> {new!r} "
    "(built -> config); delete it to rebuild, or set config.data.dir to the data you want"
  )
  with pytest.raises(ValueError, match=r"built from other text and options: .* dupe_factor 1 -> 2"):
    run_data.ensure_built(_trainer_config(b, **{"data.dupe_factor": 2}), str(wd))
  with pytest.raises(ValueError, match=r"built with other options: dupe_factor 1 -> 2 \(built"):
    run_data.ensure_built(_trainer_config(a, **{"data.dupe_factor": 2}), str(wd))
  # Another vocab (BERT's, where the data has the corpus's own): its fingerprint differs.
  with pytest.raises(ValueError, match=r"built with other options: tokenizer '[0-9a-f]{12}' ->"):
    run_data.ensure_built(_trainer_config(a, **{"data.train_vocab_size": 0}), str(wd))
  assert _snapshot(wd) == before

  # metadata.json of an older version (no input_sha256): a clear answer, no guess.
  meta["source"].pop("input_sha256")
  (wd / "data" / "metadata.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError) as e:
    run_data.ensure_built(_trainer_config(a), str(wd))
  assert str(e.value) == (
    f"{data_dir}/metadata.json does not record the content of the text it was built from "
    "(built by an older bert_jax): delete it to rebuild, or set config.data.dir to it to use "
    "it as it is"
  )
