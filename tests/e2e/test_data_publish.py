"""Fault suite, publishing a dataset (46.5): real `python -m bert_jax.create_data` processes on
real files. Two builds into one fresh --output_dir (a sweep started twice) leave one build's
whole output, the other stops in one line or keeps the identical build; a reader refuses a
shard that is not the one metadata.json describes, even when the record counts agree."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from unit.test_train import ROOT, _env, _main_cmd

from bert_jax.data import input_pipeline

CORPUS = str(ROOT / "bert_jax" / "data" / "sample_public_domain.txt")


def _cmd(out, *extra):
  return [
    sys.executable,
    "-m",
    "bert_jax.create_data",
    f"--input={CORPUS}",
    f"--output_dir={out}",
    "--noprogress",
    "--max_seq_length=64",
    "--max_predictions_per_seq=10",
    *extra,
  ]


def _popen(out, extra):
  return subprocess.Popen(
    _cmd(out, *extra), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )


def _race(out, first, second, delay):
  """Starts `first`, then `second` `delay` s later, both into `out`; their results."""
  procs = []
  for extra in (first, second):
    procs.append(_popen(out, extra))
    time.sleep(delay)
  outs = [p.communicate(timeout=600) for p in procs]
  return [(p.returncode, *o) for p, o in zip(procs, outs, strict=True)]


def _whole(out):
  """The dataset in `out` is one build's whole output: every shard metadata.json lists is on
  disk with its fingerprint, nothing else is, and no temporary directory is left."""
  meta = json.loads((out / "metadata.json").read_text())
  listed = []
  for split in meta["splits"]:
    listed += [os.path.basename(f) for f in input_pipeline.split_files(str(out), split, meta)]
  assert sorted(n for n in os.listdir(out) if n.endswith(".array_record")) == sorted(listed)
  assert not [n for n in os.listdir(out) if n.startswith(".")]
  return meta


@pytest.mark.slow
def test_two_builds_into_one_fresh_directory_leave_one_whole_build(tmp_path):
  """A slow build (20 passes) and a quick one of another seed into the same fresh directory,
  in an order no machine load can change: the slow one starts, is paused (SIGSTOP) once its
  temporary directory shows it found the directory empty, the quick one then finds it empty too
  and publishes, and the slow one resumes: finding another build there when it publishes, it
  stops in one line and leaves nothing of its own. The output is the quick build's, whole. Then
  the same command twice, 1 s apart: the second finds the identical build there and keeps it
  (exit 0), or, started after it, refuses at once."""
  out = tmp_path / "out"
  slow_proc = _popen(out, ["--dupe_factor=20", "--num_workers=1", "--seed=1"])
  deadline = time.monotonic() + 300
  while not (out.is_dir() and any(n.startswith(".create_data-") for n in os.listdir(out))):
    assert slow_proc.poll() is None, slow_proc.communicate()[1][-2000:]
    assert time.monotonic() < deadline, "the slow build made no temporary directory in 300 s"
    time.sleep(0.05)
  slow_proc.send_signal(signal.SIGSTOP)
  try:
    quick_proc = _popen(out, ["--num_workers=1", "--seed=2"])
    quick, (_, quick_err) = quick_proc.wait(timeout=600), quick_proc.communicate()
  finally:
    slow_proc.send_signal(signal.SIGCONT)
  slow_err = slow_proc.communicate(timeout=600)[1]
  slow = slow_proc.returncode
  assert quick == 0, quick_err[-2000:]
  assert slow == 1, slow_err[-2000:]
  meta = _whole(out)
  assert meta["seed"] == 2 and meta["dupe_factor"] == 1
  assert re.fullmatch(
    rf"create_data: error: --output_dir={out}: another build put a dataset there while this "
    rf"one ran \(build {meta['build_id'][:12]}, not this build's [0-9a-f]{{12}}\); nothing of "
    r"this build is left; pass --overwrite to replace it",
    slow_err.strip().splitlines()[-1],
  ), slow_err[-2000:]
  assert "Errno" not in slow_err and "Traceback" not in slow_err

  again = tmp_path / "again"
  results = _race(again, ["--dupe_factor=5", "--num_workers=2"], ["--dupe_factor=5"], 1)
  assert results[0][0] == 0, results[0][2][-2000:]
  meta = _whole(again)
  rc, _, err = results[1]
  last = err.strip().splitlines()[-1]
  if rc == 0:  # it found the identical build there when it published
    assert last == (
      f"create_data: another build of this very dataset (build {meta['build_id'][:12]}) "
      f"finished into {again} first: kept it"
    )
  else:  # it started after the first had published
    assert rc == 1 and "already holds a dataset" in last, err[-2000:]


@pytest.mark.slow
def test_a_shard_of_another_build_is_refused_even_with_equal_counts(tmp_path):
  """Two builds whose record counts agree (static masks at another masking rate: the same
  sequences, other masks): a directory holding one's metadata.json and the other's train shard
  is refused by the trainer in one line naming the shard, before any step."""
  a, b = tmp_path / "a", tmp_path / "b"
  for out, prob in ((a, "0.15"), (b, "0.2")):
    r = subprocess.run(
      _cmd(out, "--write_masks", f"--masked_lm_prob={prob}", "--num_workers=1"),
      env=_env(),
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
  meta_a = json.loads((a / "metadata.json").read_text())
  meta_b = json.loads((b / "metadata.json").read_text())
  assert meta_a["splits"]["train"]["num_sequences"] == meta_b["splits"]["train"]["num_sequences"]
  (shard,) = meta_a["splits"]["train"]["files"]
  assert (a / shard).read_bytes() != (b / shard).read_bytes()
  shutil.copyfile(b / shard, a / shard)
  r = subprocess.run(
    _main_cmd(tmp_path / "wd", str(a), 2, ["--config.masking.mode=static"]),
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 1, r.stderr[-2000:]
  # The command's own last line (a library's log line from a thread may follow it).
  assert [ln for ln in r.stderr.splitlines() if ln.startswith("main: ")][-1] == (
    f"main: error: {a / shard} is not the shard {a}/metadata.json describes (its size or content "
    "differs: another build's file, or one changed since): rebuild the dataset with python -m "
    "bert_jax.create_data"
  )
  assert not list((tmp_path / "wd").glob("checkpoints/[0-9]*"))  # no step trained or saved
  assert not (tmp_path / "wd" / "metrics.jsonl").exists()
