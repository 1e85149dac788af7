"""gs:// workdirs through an offline stand-in for GCS (tests/fake_gcs.py: etils.epath's gs://
backend over a local directory, orbax's TensorStore kvstore pointed at the same place): a run
trains, stops, resumes, and everything lands in the store, nothing in a local `gs:` directory.
Plus what cannot be served: other schemes, gs:// without its packages, data on an object store.
"""

import json
import os
import subprocess
import sys
import time

import fake_gcs
import pytest

from bert_jax import loop
from bert_jax.data import run_data
from bert_jax.runtime import files, workdir_lock
from unit.test_train import _env


def _rows(text, split="train"):
  return [r for r in map(json.loads, text.splitlines()) if r["split"] == split]


@pytest.fixture
def gcs(tmp_path, monkeypatch):
  """gs:// of this process served from tmp_path/store (undone after the test)."""
  store = tmp_path / "store"
  store.mkdir()
  monkeypatch.chdir(tmp_path)
  fake_gcs.install(store, monkeypatch)
  yield store
  fake_gcs.uninstall(monkeypatch)
  assert not (tmp_path / "gs:").exists()


def test_metrics_and_tensorboard_on_gs(gcs):
  log = loop.MetricLogger("gs://bucket/run", 0)
  for step in range(1, 7):  # a run killed after step 6, its last checkpoint at 4
    log.write(step, "train", {"loss": float(step)})
  log.close()
  log = loop.MetricLogger("gs://bucket/run", 4)
  log.write(5, "train", {"loss": 15.0})
  log.close()
  text = (gcs / "bucket" / "run" / "metrics.jsonl").read_text()
  assert [(r["step"], r["loss"]) for r in _rows(text)] == [
    (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0)
  ]  # fmt: skip
  events = os.listdir(gcs / "bucket" / "run" / "tb")
  assert events and all(n.startswith("events.out.tfevents.") for n in events)
  assert not os.path.exists(log.tb.logdir)  # the local temporary copy is gone


def test_lock_on_gs(gcs):
  path = gcs / "bucket" / "wd" / workdir_lock.LOCK_FILE
  a, b = workdir_lock.WorkdirLock("gs://bucket/wd"), workdir_lock.WorkdirLock("gs://bucket/wd")
  a.SETTLE_S = b.SETTLE_S = 0.0
  with a:
    assert json.loads(path.read_text())["pid"] == os.getpid()
    with pytest.raises(OSError, match=r"^gs://bucket/wd is in use by another trainer \(pid"):
      b.acquire()
  assert not path.exists()
  # Another host's lock not refreshed for STALE_S (the time is in the object): taken over.
  path.write_text(json.dumps({"host": "tpu-7", "pid": 12, "token": "x", "time": 0.0}))
  with b:
    assert json.loads(path.read_text())["pid"] == os.getpid()
  path.write_text("")  # not a lock being written (objects appear whole): a broken one
  with b:
    assert json.loads(path.read_text())["pid"] == os.getpid()
  path.write_text(json.dumps({"host": "tpu-7", "pid": 12, "token": "x", "time": 1e12}))
  with pytest.raises(OSError, match=r"in use by a trainer on host tpu-7 \(pid 12"):
    a.acquire()


def test_lock_on_gs_race_has_one_winner(gcs, monkeypatch):
  """Both trainers find no lock and write theirs; the later write wins, the earlier writer
  reads the other's token back and stops."""
  path = gcs / "bucket" / "wd" / workdir_lock.LOCK_FILE
  a = workdir_lock.WorkdirLock("gs://bucket/wd")

  def b_writes_meanwhile(seconds):  # a's settle wait, when b (which found no lock either) writes
    path.write_text(json.dumps({"host": "tpu-7", "pid": 12, "token": "b", "time": time.time()}))

  monkeypatch.setattr(workdir_lock.time, "sleep", b_writes_meanwhile)
  with pytest.raises(OSError, match=r"in use by a trainer on host tpu-7 \(pid 12"):
    a.acquire()
  assert json.loads(path.read_text())["token"] == "b"


def test_schemes_that_cannot_be_served():
  with pytest.raises(ValueError, match=r"^workdir s4://x/run: the s4:// scheme is not supported"):
    files.as_path("s4://x/run", "workdir")
  assert str(files.as_path("rel/dir")) == os.path.abspath("rel/dir")


def test_gs_without_its_packages_is_one_line():
  try:
    import gcsfs  # noqa: F401
    import google.cloud.storage  # noqa: F401

    pytest.skip("gcsfs and google-cloud-storage are installed")
  except ImportError:
    pass
  with pytest.raises(ImportError, match=r"^--workdir gs://b/run: gs:// needs .*\(pip install"):
    files.as_path("gs://b/run", "--workdir")


def test_data_on_an_object_store_is_refused():
  import ml_collections

  config = ml_collections.ConfigDict({"data": {"dir": "gs://b/data", "input": ""}})
  with pytest.raises(ValueError, match=r"^config.data.dir=gs://b/data: ArrayRecord reads local"):
    run_data.ensure_built(config, "/tmp/wd")
  config.data.dir, config.data.input = "", "corpus.txt"
  with pytest.raises(ValueError, match=r"^workdir gs://b/run is on an object store, where"):
    run_data.ensure_built(config, "gs://b/run")


def test_unsupported_workdir_fails_before_compute(tmp_path):
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.main", "--config=local:size=tiny", "--workdir=s4://x/run"],
    cwd=tmp_path,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 1
  assert r.stderr.splitlines() == [
    "main: error: --workdir s4://x/run: the s4:// scheme is not supported (a local path or "
    "gs://bucket/path)"
  ]
  assert os.listdir(tmp_path) == []
