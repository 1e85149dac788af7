"""gs:// workdirs through an offline stand-in for GCS (tests/fake_gcs.py: etils.epath's gs://
backend over a local directory, orbax's TensorStore kvstore pointed at the same place): a run
trains, stops, resumes, and everything lands in the store, nothing in a local `gs:` directory.
Plus what cannot be served: other schemes, gs:// without its packages, data on an object store.
"""

import json
import os
import subprocess
import sys

import fake_gcs
import pytest

from bert_jax import loop
from bert_jax.data import run_data
from bert_jax.runtime import files
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
