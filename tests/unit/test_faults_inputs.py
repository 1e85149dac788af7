"""Fault suite, inputs a run cannot use (issue 46): a corpus too small for an eval split, a file
with CR-only line ends, a metrics.jsonl that is not a regular file or a tb that is one, no home
directory, `ulimit -v`, a refused init_from, an --overwrite export killed at its swap, and the
notebook API's edge arguments. Real `python -m` processes on real files; each asserts what is on
disk afterwards: one line, nothing made that the run would not keep, nothing lost."""

import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import bert_jax
from bert_jax import config_lib
from bert_jax import model as model_lib
from bert_jax.interop import hf_io
from bert_jax.model_config import BertConfig
from bert_jax.runtime import files
from bert_jax.tokenizers import tokenizer as tokenizer_lib
from bert_jax.tokenizers import training as tokenizer_training
from unit.test_train import _env, _main_cmd

CORPUS = config_lib.BUNDLED_CORPUS


def _run(cmd, **kw):
  kw.setdefault("env", _env())
  kw.setdefault("timeout", 600)
  return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _error(r, prog="main", status=1):
  """The one `PROG: error: ...` line that ends a failed command (absl log lines aside)."""
  assert r.returncode == status, r.stderr[-3000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not re.match(r"[IWEF]\d{4} ", ln)]
  assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), r.stderr[-3000:]
  return lines[0].removeprefix(f"{prog}: error: ")


def _documents(n):
  """The first n documents of the bundled corpus, as its text."""
  docs = [d for d in pathlib.Path(CORPUS).read_text().split("\n\n") if d.strip()]
  return "\n\n".join(docs[:n]) + "\n"


def _create_data(inp, out, *extra):
  return _run([sys.executable, "-m", "bert_jax.create_data", f"--input={inp}",
               f"--output_dir={out}", "--noprogress", "--num_workers=1", *extra])  # fmt: skip


def _snapshot(d):
  return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- fault 3


def test_one_document_corpus_is_one_line_from_create_data(tmp_path):
  """One document (or one sentence) cannot give an eval split: one line naming the count and
  both ways out, --output_dir not made; --eval_fraction=0 builds it without one."""
  one_doc = tmp_path / "one_doc.txt"
  one_doc.write_text(_documents(1))
  one_sentence = tmp_path / "one_sentence.txt"
  one_sentence.write_text(_documents(1).splitlines()[0] + "\n")
  for inp in (one_doc, one_sentence):
    line = _error(_create_data(inp, tmp_path / "out"), "create_data")
    assert line == (
      f"--input={inp}: 1 document (a blank line ends one), 0 held out by --eval_fraction=0.01, "
      "give no eval sequences: give it at least 2 documents, or pass --eval_fraction=0 to build "
      "without an eval split; nothing was written"
    )
    assert not (tmp_path / "out").exists()
  r = _create_data(one_doc, tmp_path / "out", "--eval_fraction=0")
  assert r.returncode == 0, r.stderr[-2000:]
  meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
  assert meta["splits"]["eval"]["num_sequences"] == 0 and meta["splits"]["train"]["num_sequences"]


def test_cr_only_line_ends_are_read_one_way(tmp_path):
  """A file with CR-only line ends (old Mac) is the same text as with LF ends: the same
  documents in create_data's first pass and when re-read (it used to be 1 document, then 5),
  the same sequences, the same vocab."""
  text = _documents(5)
  (tmp_path / "lf.txt").write_text(text)
  (tmp_path / "cr.txt").write_bytes(text.replace("\n", "\r").encode())
  (tmp_path / "crlf.txt").write_bytes(text.replace("\n", "\r\n").encode())
  metas, shards = {}, {}
  for name in ("lf", "cr", "crlf"):
    r = _create_data(tmp_path / f"{name}.txt", tmp_path / name, "--max_seq_length=64")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "documents 5 (train 4, eval 1)" in r.stderr, r.stderr
    metas[name] = json.loads((tmp_path / name / "metadata.json").read_text())
    shards[name] = {p.name: p.read_bytes() for p in (tmp_path / name).glob("*.array_record")}
  for name in ("cr", "crlf"):
    assert shards[name] == shards["lf"]
    assert metas[name]["stats"] == metas["lf"]["stats"]
  vocabs = [
    tokenizer_training.train(str(tmp_path / f"{n}.txt"), "wordpiece", 300, str(tmp_path / n / "v"))
    for n in ("lf", "cr", "crlf")
  ]
  assert len({tuple(tok.id_to_token(i) for i in range(300)) for tok, _ in vocabs}) == 1


def test_read_lines_ends_lines_as_universal_newlines_in_any_block():
  import io

  for data in (b"a\nb\n", b"a\r\nb\r\n", b"a\rb\r", b"a\r\rb", b"ab\r\ncd\r\n\r\nef", b"\r", b""):
    for block in (1, 2, 3, 64):
      got = list(files.read_lines(io.BytesIO(data), block=block))
      assert got == [x.encode() for x in data.decode().splitlines()], (data, block)
  assert list(files.read_lines(io.BytesIO(b"ok\r0123456789\rok"), limit=4, block=3)) == [
    b"ok",
    None,
    b"ok",
  ]


# ----------------------------------------------------------------------------- fault 7, also


@pytest.mark.parametrize("kind", ["dev_full", "directory", "tb_file"])
def test_log_paths_that_are_not_what_a_run_keeps_there(tiny_data_dir, tmp_path, kind):
  """metrics.jsonl a link to /dev/full (read whole, it filled memory: 23.8 GB in 66 s) or a
  directory ([Errno 21]), tb a file ([Errno 20]): one line naming the path and what it is,
  before the run changes anything: the finished run's record stays."""
  wd = tmp_path / "wd"
  wd.mkdir()
  status = '{"state": "finished", "step": 4, "total_steps": 4}'
  (wd / "run_status.json").write_text(status)
  if kind == "dev_full":
    os.symlink("/dev/full", wd / "metrics.jsonl")
    what = "metrics.jsonl is a character device (a link to /dev/full), not the run's metrics log"
  elif kind == "directory":
    (wd / "metrics.jsonl").mkdir()
    what = "metrics.jsonl is a directory, not the run's metrics log"
  else:
    (wd / "tb").write_text("")
    what = "tb is a regular file, not the run's TensorBoard directory"
  r = _run(_main_cmd(wd, tiny_data_dir, 4), timeout=120)
  assert _error(r).startswith(f"{wd}/{what}"), r.stderr[-2000:]
  assert (wd / "run_status.json").read_text() == status
  assert sorted(p.name for p in wd.iterdir()) == sorted(
    ["run_status.json", "tb" if kind == "tb_file" else "metrics.jsonl"]
  )


def test_metrics_log_is_read_a_row_at_a_time(tmp_path):
  from bert_jax import loop

  path = tmp_path / "metrics.jsonl"
  path.write_bytes(b'{"step": 1, "split": "train"}\n' + b"x" * (loop.MAX_ROW_BYTES + 10) + b"\n")
  with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a JSON row \(over 1048576 bytes"):
    loop.repair_metrics_log(str(path), 10)
  path.write_text('{"step": 1, "split": "train"}\n{"step": 2, "split": "train"}\n{"st')
  loop.repair_metrics_log(str(path), 1)  # the torn last line and the rows after step 1 go
  assert path.read_text() == '{"step": 1, "split": "train"}\n'


# ----------------------------------------------------------------------------- fault 9


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_no_home_directory_turns_the_cache_off_in_one_line(tmp_path):
  """No HOME and no passwd entry (a batch job's container): the compilation cache used to go
  into a directory literally named `~` in the current one; now it is off, with one warning."""
  env = {k: v for k, v in _env().items() if k not in ("HOME", "JAX_COMPILATION_CACHE_DIR")}
  env.pop("XDG_CACHE_HOME", None)
  probe = ["unshare", "-U", "--map-user=12345", "--map-group=12345"]
  check = subprocess.run([*probe, "true"], capture_output=True)
  if check.returncode:
    pytest.skip(f"user namespaces unavailable: {check.stderr.decode().strip()}")
  cmd = _main_cmd("wd", tmp_path / "nodata", 2)
  r = subprocess.run(
    [*probe, *cmd], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
  )
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert lines == [
    "warning: compilation cache off: no home directory for ~/.cache (HOME is unset and the user "
    "has no passwd entry); --compilation_cache_dir=DIR sets it, --compilation_cache_dir=none "
    "silences this",
    f"main: error: config.data.dir={tmp_path / 'nodata'} has no metadata.json: build it with "
    "python -m bert_jax.create_data",
  ], r.stderr
  assert list(tmp_path.iterdir()) == []  # no `~`, no workdir


# ----------------------------------------------------------------------------- also


def test_ulimit_v_below_what_xla_reserves_is_one_line(tmp_path):
  """Under `ulimit -v` 2.5 GB the bundled default hung in the data reader's threads, at 0.7 GB
  XLA aborted with a C++ stack dump: now one line, before anything is made."""
  limit = int(2.5 * 2**30)
  hard = resource.getrlimit(resource.RLIMIT_AS)[1]
  if hard != resource.RLIM_INFINITY and hard < limit:
    pytest.skip("the hard address-space limit is lower still")
  main = f"{sys.executable} -m bert_jax.main --config=local:steps=2 --workdir=wd"
  r = _run(["bash", "-c", f"ulimit -v {limit >> 10} && exec {main}"], cwd=tmp_path)
  assert _error(r) == (
    "the address-space limit (ulimit -v) is 2.5 GiB, below the 4 GiB that XLA's and the data "
    "reader's threads reserve (a run uses far less memory than it reserves): raise it (ulimit -v "
    "unlimited) and limit resident memory instead (a cgroup, SLURM --mem)"
  )
  assert list(tmp_path.iterdir()) == []


def _params_dir(path, seed):
  cfg = BertConfig(vocab_size=99, hidden_size=16, num_layers=2, num_heads=2,
                             intermediate_size=32, max_position_embeddings=32)  # fmt: skip
  words = [f"w{i}" for i in range(cfg.vocab_size - len(tokenizer_lib.SPECIAL_TOKENS))]
  tok = tokenizer_lib.WordPieceTokenizer([*tokenizer_lib.SPECIAL_TOKENS, *words])
  params = model_lib.init_params(model_lib.BertForPreTraining(cfg), jax.random.key(seed))
  hf_io.save_params_dir(path, cfg, params, tokenizer=tok)
  return path


# Runs convert with a kill at its swap: after files.exchange (or, where the file system cannot
# swap, between the rename of the old output aside and that of the new one into place).
_KILLED_CONVERT = """
import os, signal, sys
from bert_jax.runtime import files
swap = sys.argv.pop(1) == "swap"
real_exchange, real_rename = files.exchange, os.rename
def exchange(a, b):
  if not swap:
    return False
  real_exchange(a, b)
  os.kill(os.getpid(), signal.SIGKILL)
def rename(a, b):
  real_rename(a, b)
  if ".old-" in str(b):
    os.kill(os.getpid(), signal.SIGKILL)
files.exchange, os.rename = exchange, rename
from bert_jax import convert
convert.run()
"""


def test_notebook_api_edge_arguments_are_one_line(tmp_path):
  """fill_mask([]) and embed([]) ('max() arg is an empty sequence'), attention(layer=99)
  (IndexError), load(dtype='float17') (TypeError): an empty result, or a ValueError naming the
  argument and what it may be."""
  path = str(_params_dir(tmp_path / "m", 0))
  m = bert_jax.load(path)
  assert m.fill_mask([]) == [] and m.embed([]).hidden == []
  assert len(m.fill_mask(["w1 [MASK] w2"])[0]) == 1
  with pytest.raises(ValueError, match=r"^layer=99: this model has 2 layers \(0 \.\. 1, or -1"):
    m.attention("w1 w2", layer=99)
  tokens, probs = m.attention("w1 w2", layer=-2)
  assert probs.shape == (2, 4, 4) and np.allclose(probs.sum(-1), 1, atol=1e-5)
  with pytest.raises(ValueError, match=r"hidden state 3 is not one of this model's: 0 \(the "):
    m.embed(["w1"], layers=(0, 3))
  with pytest.raises(ValueError, match=r"^top_k must be an integer >= 1, not 0$"):
    m.fill_mask("w1 [MASK]", top_k=0)
  with pytest.raises(ValueError, match=r"^dtype must be one of float32, bfloat16, float16 \(or "
                     r"None\), not 'float17'$"):  # fmt: skip
    bert_jax.load(path, dtype="float17")
  assert bert_jax.load(path, dtype=np.float32).config.dtype == "float32"
