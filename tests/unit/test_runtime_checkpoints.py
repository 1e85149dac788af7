"""Faults on restore and on write, as real runs of `python -m bert_jax.main` on real files: a
corrupt newest checkpoint falls back to the previous one, a torn metrics.jsonl tail is repaired,
a full disk (a file-size limit: the kernel's EFBIG, the same failed write as ENOSPC) ends in one
line and the run resumes afterwards. Plus the in-process pieces: TensorBoard purge on resume,
no partial metrics row, atomic config.json / tokenizer copy."""

import glob
import os
import resource
import signal
import struct
import time

import pytest

from bert_jax import loop
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.runtime import files
from unit.test_train import _rows


def _truncate_largest(step_dir):
  """Cuts the biggest array file of a checkpoint's params to 1 KB (a torn copy or upload)."""
  files = glob.glob(os.path.join(step_dir, "params", "**", "*"), recursive=True)
  big = max((f for f in files if os.path.isfile(f)), key=os.path.getsize)
  assert os.path.getsize(big) > 100_000
  os.truncate(big, 1000)


def test_storage_leftovers_are_dropped(monkeypatch):
  """What a failed restore leaves behind (a garbage-collected orbax coroutine, asyncio's
  "Event loop is closed") is dropped unless logging is verbose; anything else still shows."""
  import logging as py_logging
  import types

  seen = []
  hook = ckpt_lib._unraisable_hook(seen.append)
  orbax_code = types.SimpleNamespace(co_filename="/site-packages/orbax/checkpoint/x.py")
  leftover = types.SimpleNamespace(
    exc_value=ValueError("x"), object=types.SimpleNamespace(cr_code=orbax_code)
  )
  ours = types.SimpleNamespace(exc_value=ValueError("y"), object=None)
  absl = py_logging.getLogger("absl")
  monkeypatch.setattr(absl, "level", py_logging.WARNING)
  hook(leftover)
  hook(ours)
  assert seen == [ours]
  record = py_logging.LogRecord(
    "asyncio", py_logging.ERROR, "x.py", 1, "Event loop is closed", None, None
  )
  other = py_logging.LogRecord("asyncio", py_logging.ERROR, "x.py", 1, "other", None, None)
  f = ckpt_lib._StorageLeftovers()
  assert (f.filter(record), f.filter(other)) == (False, True)
  monkeypatch.setattr(absl, "level", py_logging.INFO)  # --verbosity=0: everything shows
  hook(leftover)
  assert seen == [ours, leftover] and f.filter(record)


def _tb_visible_steps(tb_dir):
  """Steps per tag as TensorBoard shows them: a SessionLog.START at step S (purge_step) hides
  every earlier-written event at step >= S."""
  from tensorboardX.proto import event_pb2

  events = []
  for path in sorted(glob.glob(os.path.join(tb_dir, "events.*"))):
    data = open(path, "rb").read()
    i = 0
    while i < len(data):  # TFRecord: length, crc, payload, crc
      (n,) = struct.unpack("<Q", data[i : i + 8])
      events.append(event_pb2.Event.FromString(data[i + 12 : i + 12 + n]))
      i += 12 + n + 4
  shown: dict[str, list[int]] = {}
  for e in events:
    if e.HasField("session_log") and e.session_log.status == event_pb2.SessionLog.START:
      shown = {k: [s for s in v if s < e.step] for k, v in shown.items()}
    for v in e.summary.value:
      shown.setdefault(v.tag, []).append(e.step)
  return shown


def test_resume_drops_later_rows_and_tensorboard_events(tmp_path):
  log = loop.MetricLogger(str(tmp_path), 0)
  for step in range(1, 7):  # a run killed after step 6, its last checkpoint at 4
    log.write(step, "train", {"loss": float(step)})
  log.close()
  time.sleep(1.1)  # tensorboardX names event files by the second: a real restart takes longer
  log = loop.MetricLogger(str(tmp_path), 4)
  for step in (5, 6, 7):
    log.write(step, "train", {"loss": 10.0 + step})
  log.close()
  assert [(r["step"], r["loss"]) for r in _rows(tmp_path)] == [
    (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0), (6, 16.0), (7, 17.0)
  ]  # fmt: skip
  assert _tb_visible_steps(tmp_path / "tb") == {"train/loss": [1, 2, 3, 4, 5, 6, 7]}


def test_torn_line_inside_the_log_is_an_error(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "spl\n{"step": 2, "split": "train"}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:1 is not a JSON row"):
    loop.repair_metrics_log(str(tmp_path / "metrics.jsonl"), 10)


@pytest.fixture
def file_size_limit():
  """Sets this process's file-size limit (writes past it fail with EFBIG) and restores it."""
  old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
  old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  yield lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (n, old_limit[1]))
  resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
  signal.signal(signal.SIGXFSZ, old_handler)


def test_failed_metrics_append_leaves_no_partial_row(tmp_path, file_size_limit):
  log = loop.MetricLogger(str(tmp_path), 0)
  log.write(1, "train", {"loss": 1.0})
  before = (tmp_path / "metrics.jsonl").read_bytes()
  file_size_limit(len(before) + 10)
  with pytest.raises(OSError, match=f"^cannot write {tmp_path}/metrics.jsonl: File too large$"):
    log.write(2, "train", {"loss": 2.0})
  assert (tmp_path / "metrics.jsonl").read_bytes() == before
  file_size_limit(resource.RLIM_INFINITY)
  log.close()


def test_atomic_writes_keep_the_old_file(tmp_path, file_size_limit):
  path = tmp_path / "config.json"
  files.write_atomic(str(path), "old")
  src = tmp_path / "src"
  src.mkdir()
  (src / "vocab.txt").write_text("y" * 1000)
  file_size_limit(100)
  with pytest.raises(OSError, match=f"^cannot write {path}: File too large$"):
    files.write_atomic(str(path), "x" * 1000)
  assert path.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["config.json", "src"]

  (tmp_path / "tokenizer.tmp").mkdir()  # left by a killed copy
  with pytest.raises(OSError, match=f"^cannot copy {src} to {tmp_path}/tokenizer: "):
    files.copytree_atomic(str(src), str(tmp_path / "tokenizer"))
  assert sorted(os.listdir(tmp_path)) == ["config.json", "src"]
  file_size_limit(resource.RLIM_INFINITY)
  files.copytree_atomic(str(src), str(tmp_path / "tokenizer"))
  assert (tmp_path / "tokenizer" / "vocab.txt").read_text() == "y" * 1000
