"""Fault suite, resume mismatches and non-finite gradients: each case a real
`python -m bert_jax.main` run against real files."""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import pretraining as pretraining_data
from bert_jax.data import run_data
from bert_jax.tokenizers import tokenizer as tokenizer_lib
from unit.test_train import _env, _main_cmd


def _run(workdir, data_dir, steps, *extra):
  return subprocess.run(
    _main_cmd(workdir, data_dir, steps, list(extra)), env=_env(), capture_output=True, text=True
  )


def _error(r):
  """The one `main: error: ...` line that ends a failed run (absl's log lines aside)."""
  assert r.returncode == 1, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not re.match(r"[IWE]\d{4} ", ln)]
  assert len(lines) == 1 and lines[0].startswith("main: error: "), r.stderr[-2000:]
  return lines[0]


@pytest.fixture(scope="module")
def trained4(tiny_data_dir, tmp_path_factory):
  """A workdir with a checkpoint at step 4 (the tests copy it)."""
  wd = tmp_path_factory.mktemp("resume") / "wd"
  r = _run(wd, tiny_data_dir, 4)
  assert r.returncode == 0, r.stderr[-2000:]
  return wd


def _copy(src, tmp_path, name="wd"):
  dst = tmp_path / name
  shutil.copytree(src, dst)
  return dst


def _build(tiny_data_dir, out, vocab=None, **over):
  """tiny_data_dir's build (conftest) with other options or another vocab."""
  opts = dict(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1, eval_fraction=0.05)
  opts.update(over)
  corpus = os.path.join(os.path.dirname(config_lib.__file__), "data", "sample_public_domain.txt")
  pretraining_data.build(corpus, str(out), vocab=vocab, num_workers=1, progress=False, **opts)
  return str(out)


def test_other_tokenizer_refused_on_resume_and_init_from(trained4, tiny_data_dir, tmp_path):
  """Data built with another vocab of the same size (two tokens swapped) is refused."""
  vocab = tmp_path / "vocab.txt"
  lines = open(tokenizer_lib.default_vocab_path()).read().splitlines(keepends=True)
  lines[2000], lines[2001] = lines[2001], lines[2000]
  vocab.write_text("".join(lines))
  other = _build(tiny_data_dir, tmp_path / "other_tok", vocab=str(vocab))
  wd = _copy(trained4, tmp_path)
  line = _error(_run(wd, other, 8))
  assert "would not be exact: tokenizer " in line and "resume_allow_changes=tokenizer" in line
  line = _error(_run(tmp_path / "fresh", other, 2, f"--config.init_from={trained4}"))
  assert f"init_from {trained4}: its tokenizer (fingerprint" in line


def test_resume_onto_data_rebuilt_from_an_edited_text_is_refused(trained4, tiny_data_dir, tmp_path):
  """37.3: create_data --overwrite into the run's data directory from the corpus with one word
  of one document edited (same options, same split sizes: only the text's content hash
  differs). The rerun used to resume without a word and diverge; it stops in one line naming
  the hashes, and nothing in the workdir changes."""
  data = shutil.copytree(tiny_data_dir, tmp_path / "data")
  wd = _copy(trained4, tmp_path)
  corpus = os.path.join(os.path.dirname(config_lib.__file__), "data", "sample_public_domain.txt")
  edited = tmp_path / "edited.txt"
  edited.write_text(open(corpus).read().replace("Alice", "Carol", 1))
  build = [sys.executable, "-m", "bert_jax.create_data", f"--input={edited}"]
  build += [f"--output_dir={data}", "--overwrite", "--noprogress", "--num_workers=1"]
  build += ["--max_seq_length=64", "--max_predictions_per_seq=10", "--eval_fraction=0.05"]
  r = subprocess.run(build, env=_env(), capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  new_meta = json.loads((data / "metadata.json").read_text())
  old_meta = json.loads(open(os.path.join(tiny_data_dir, "metadata.json")).read())
  assert new_meta["splits"] == old_meta["splits"]  # the same sizes: only the content tells
  before = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()}
  line = _error(_run(wd, data, 8))
  old_sha, new_sha = (m["source"]["input_sha256"][:12] for m in (old_meta, new_meta))
  assert line == (
    f"main: error: resuming {wd}/checkpoints/4 would not be exact: dataset.input_sha256 "
    f"{old_sha!r} -> {new_sha!r} (checkpoint -> now); restore the old values, use a new workdir, "
    "or allow it with --config.resume_allow_changes=dataset.input_sha256"
  )
  assert {p: p.read_bytes() for p in before} == before
  assert sorted(p for p in wd.rglob("*") if p.is_file()) == sorted(before)


def test_auto_built_data_not_reused_with_other_options(tmp_path):
  """`<workdir>/data` built from config.data.input is refused when the config asks for other
  build options (it used to be reused silently)."""
  c = config_lib.base_config("tiny")
  c.data.input = config_lib.BUNDLED_CORPUS
  c.data.max_seq_length = 64
  c.masking.max_predictions = 10
  c.data.dupe_factor = 1
  c.data.eval_fraction = 0.05  # as configs/local.py
  wd = tmp_path / "wd"
  pretraining_data.build(
    **run_data.build_options(c),
    output_dir=str(wd / "data"),
    vocab=tokenizer_lib.default_vocab_path(),
    num_workers=1,
    progress=False,
  )
  extra = ["--config.data.input=" + c.data.input, "--config.data.dupe_factor=2"]
  # The data was built with BERT's vocab (local.py would train one of its own).
  cmd = _main_cmd(wd, "", 2, [*extra, "--config.data.train_vocab_size=0"])
  cmd.remove("--config.data.dir=")
  r = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
  line = _error(r)
  # Only the changed option is named (the others were compared and agree).
  assert line.endswith(
    f"{wd / 'data'} was built with other options: dupe_factor 1 -> 2 (built -> config); delete it "
    "to rebuild, or set config.data.dir to the data you want"
  )


def test_refused_or_failed_rerun_keeps_the_finished_record(trained4, tiny_data_dir, tmp_path):
  """run_status.json of a finished run survives a rerun that is refused (a changed warmup) or
  fails (no checkpoint restores): bad input writes nothing."""
  wd = _copy(trained4, tmp_path)
  status = (wd / "run_status.json").read_bytes()
  assert json.loads(status)["state"] == "finished"
  files = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file() and "checkpoints" not in p.parts}
  line = _error(_run(wd, tiny_data_dir, 4, "--config.opt.warmup_steps=3"))
  assert "opt.warmup_steps" in line, line
  assert {p: p.read_bytes() for p in files} == files  # every file as it was
  for step_dir in (wd / "checkpoints").iterdir():  # now no checkpoint restores
    for f in step_dir.rglob("*"):
      if f.is_file() and f.stat().st_size > 100:
        f.write_bytes(f.read_bytes()[:100])
  line = _error(_run(wd, tiny_data_dir, 4))
  assert "no checkpoint in" in line, line
  assert (wd / "run_status.json").read_bytes() == status
  assert not (wd / "bert_jax.lock").exists()


@contextlib.contextmanager
def _read_only(path):
  """`path` read-only for this test's processes: a read-only bind mount where we are root
  (root ignores permissions), else the write permissions taken away."""
  if os.geteuid() == 0:
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
      subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
      yield "Read-only file system"
    finally:
      subprocess.run(["umount", str(path)], check=True)
  else:
    subprocess.run(["chmod", "-R", "a-w", str(path)], check=True)
    try:
      yield "Permission denied"
    finally:
      subprocess.run(["chmod", "-R", "u+w", str(path)], check=True)


def _files(root):
  return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_read_only_finished_run(trained4, tiny_data_dir, tmp_path):
  """37.5: rerunning a finished run whose workdir is read-only (an archive, a read-only mount)
  has nothing to write: it says so and ends with the final checkpoint's fill-mask lines, instead
  of `[Errno 30] Read-only file system: .../bert_jax.lock`. Asked to train on, it is one line."""
  wd = _copy(trained4, tmp_path)
  before = _files(wd)
  with _read_only(wd) as reason:
    r = _run(wd, tiny_data_dir, 4)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{wd} holds this run, finished at step 4, read-only: nothing to do" in r.stdout
    assert "fill_mask: " in r.stdout
    line = _error(_run(wd, tiny_data_dir, 8))
    assert line == (
      f"main: error: cannot create the lock {wd}/bert_jax.lock: {reason}: training needs a "
      "writable workdir"
    )
  assert _files(wd) == before


def _convert(src, dst, *extra):
  cmd = [sys.executable, "-m", "bert_jax.convert", f"--src={src}", f"--dst={dst}", *extra]
  return subprocess.run(cmd, env=_env(), capture_output=True, text=True)


def test_convert_refuses_to_replace_a_runs_live_files(trained4, tmp_path):
  """37.5: `convert --dst=<workdir>/checkpoints/4 --overwrite` replaced a live checkpoint with
  an export. A checkpoint step, a new step name under checkpoints/ (the trainer would take it
  for its newest step), the source's workdir and another training workdir are refused in one
  line, --overwrite or not; nothing of either run changes."""
  wd = _copy(trained4, tmp_path)
  other = _copy(trained4, tmp_path, "other")
  before = {**_files(wd), **_files(other)}
  refused = {
    wd / "checkpoints" / "4": f"is inside {wd}/checkpoints, a training run's checkpoints: write "
    "the export elsewhere (the trainer would take it for a step)",
    wd / "checkpoints" / "200": f"is inside {wd}/checkpoints, a training run's checkpoints: "
    "write the export elsewhere (the trainer would take it for a step)",
    wd: f"holds --src={wd}: write the export elsewhere",
    other: "is a training workdir: refusing to replace it; write the export elsewhere",
  }
  for dst, why in refused.items():
    r = _convert(wd, dst, "--overwrite")
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == f"convert: error: --dst={dst} {why}"
  assert {**_files(wd), **_files(other)} == before
  assert sorted(os.listdir(wd / "checkpoints")) == ["4"]


def test_convert_and_finetune_init_fall_back_past_an_empty_newest_step(trained4, tmp_path):
  """37.5: an empty newest step (a copy cut short) is passed over with one warning by convert
  and fine-tuning's config.init, as by the trainer and bert_jax.load: one mechanism
  (checkpoints.load_newest, inside loader.load_checkpoint)."""
  from bert_jax.finetune import inputs as ft_inputs
  from bert_jax.interop import loader
  from unit.test_finetune import _splits, finetune_config, sentiment

  wd = _copy(trained4, tmp_path)
  (wd / "checkpoints" / "12").mkdir()
  r = _convert(wd, tmp_path / "hf")
  assert r.returncode == 0, r.stderr[-2000:]
  warned = [ln for ln in r.stderr.splitlines() if "does not restore" in ln]
  assert len(warned) == 1 and f"{wd}/checkpoints/12 does not restore" in warned[0]
  assert "trying step 4" in warned[0]
  step4 = loader.load_checkpoint(wd, 4, scan_layers=False).params
  exported = loader.load_checkpoint(tmp_path / "hf", scan_layers=False).params
  for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(step4), strict=True):
    np.testing.assert_array_equal(a, b)

  c = finetune_config.get_config("custom,seeds=1,size=tiny")
  c.task.train, c.task.dev, c.task.test = _splits(tmp_path, sentiment, (32, 16, 16))
  c.init = str(wd)
  c.data.max_seq_length = 16
  prep = ft_inputs.prepare(c)
  assert prep.cfg.hidden_size == 32 and prep.tokenizer.vocab_size == 30522
  for a, b in zip(jax.tree.leaves(prep.init_params), jax.tree.leaves(step4["bert"]), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)
