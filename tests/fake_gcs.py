"""An offline stand-in for Google Cloud Storage: `gs://BUCKET/KEY` lives at `ROOT/BUCKET/KEY`.

What bert_jax reaches GCS through, each replaced at its narrowest point:
- etils.epath (bert_jax's workdir files; orbax's directories, metadata, commit markers; grain's
  iterator state) opens gs:// through fsspec's "gs"/"gcs" protocol (gcsfs): `FakeGCS` below is
  that protocol over a local directory. It has no append and no exclusive create, as GCS.
- TensorStore (orbax's array bytes) has its own GCS driver that speaks HTTP to
  storage.googleapis.com; no emulator runs offline, so orbax's kvstore spec for a gs:// path
  (`gcs_utils.get_kvstore_for_gcs`) is pointed at TensorStore's file driver under the same ROOT:
  the bytes land in the emulated store, TensorStore's GCS driver itself is not exercised.
- google-cloud-storage (orbax asks whether a bucket has a hierarchical namespace when it deletes
  an old step): a client whose buckets have none.

`python tests/fake_gcs.py ROOT MODULE ARGS...` runs `python -m MODULE ARGS...` with the fake
installed (ROOT also from $FAKE_GCS_ROOT).
"""

from __future__ import annotations

import importlib
import os
import runpy
import shutil
import sys
import types

import fsspec
import pytest

ROOT_ENV = "FAKE_GCS_ROOT"


class FakeGCS(fsspec.AbstractFileSystem):
  """fsspec's gs:// protocol over `os.environ[ROOT_ENV]`; names come back as gcsfs gives them
  ("bucket/key", no scheme)."""

  protocol = ("gs", "gcs")
  root_marker = ""

  def __init__(self, *args, **kwargs):  # gcsfs options (finalize_on_close, ...) do not apply
    super().__init__()

  @property
  def root(self) -> str:  # read each time: fsspec and epath cache the instance
    return os.environ[ROOT_ENV]

  def _local(self, path: str) -> str:
    return os.path.join(self.root, self._strip_protocol(path).lstrip("/"))

  def _info(self, local: str) -> dict:
    st = os.stat(local)
    kind = "directory" if os.path.isdir(local) else "file"
    name = os.path.relpath(local, self.root)
    return {"name": name, "size": st.st_size, "type": kind, "mtime": st.st_mtime}

  def info(self, path, **kwargs):
    local = self._local(path)
    if not os.path.exists(local):
      raise FileNotFoundError(path)
    return self._info(local)

  def ls(self, path, detail=True, **kwargs):
    local = self._local(path)
    if os.path.isdir(local):
      infos = [self._info(os.path.join(local, n)) for n in sorted(os.listdir(local))]
    elif os.path.exists(local):
      infos = [self._info(local)]
    else:
      raise FileNotFoundError(path)
    return infos if detail else [i["name"] for i in infos]

  def _open(self, path, mode="rb", **kwargs):
    if "a" in mode or "x" in mode or "+" in mode:
      raise NotImplementedError(f"object stores have no mode {mode!r} ({path})")
    local = self._local(path)
    if "w" in mode:
      os.makedirs(os.path.dirname(local), exist_ok=True)
    return open(local, mode)

  def makedirs(self, path, exist_ok=False):
    os.makedirs(self._local(path), exist_ok=exist_ok)

  def mkdir(self, path, create_parents=True, **kwargs):
    local = self._local(path)
    if create_parents:
      os.makedirs(local, exist_ok=True)
    else:
      os.mkdir(local)

  def rm_file(self, path):
    local = self._local(path)
    # fsspec's recursive rm lists "directories" too (GCS has none): they are empty by then.
    os.rmdir(local) if os.path.isdir(local) else os.remove(local)

  def rmdir(self, path):
    os.rmdir(self._local(path))

  def cp_file(self, path1, path2, **kwargs):
    dst = self._local(path2)
    if os.path.isdir(self._local(path1)):
      os.makedirs(dst, exist_ok=True)
      return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(self._local(path1), dst)


def _kvstore_for_gcs(path: str) -> dict:
  """TensorStore's file driver at the emulated location of `path` (orbax passes gs://...)."""
  rest = str(path).removeprefix("gs://")
  return {"driver": "file", "path": os.path.join(os.environ[ROOT_ENV], rest)}


def _module(name: str, patch: pytest.MonkeyPatch) -> types.ModuleType:
  try:
    return importlib.import_module(name)
  except ImportError:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so submodules can sit under it
    patch.setitem(sys.modules, name, module)
    return module


def install(root: str, patch: pytest.MonkeyPatch) -> None:
  """Routes this process's gs:// paths to `root`; `patch.undo()` takes it all back."""
  from etils.epath import backend
  from orbax.checkpoint._src.path import gcs_utils

  patch.setenv(ROOT_ENV, str(root))
  registry = importlib.import_module("fsspec.registry")._registry  # `fsspec.registry` is a view
  for name in FakeGCS.protocol:
    patch.setitem(registry, name, FakeGCS)
  backend.fsspec_backend._get_filesystem.cache_clear()  # epath caches the gcsfs instance
  patch.setattr(gcs_utils, "get_kvstore_for_gcs", _kvstore_for_gcs)

  # google-cloud-storage need not be installed: stand-ins for the namespace packages too.
  google = sys.modules.get("google") or _module("google", patch)
  cloud = sys.modules.get("google.cloud") or _module("google.cloud", patch)
  patch.setattr(google, "cloud", cloud, raising=False)
  storage = types.ModuleType("google.cloud.storage")

  class Client:
    def get_bucket(self, name):
      return types.SimpleNamespace(name=name, hierarchical_namespace_enabled=False)

  storage.Client = Client
  patch.setitem(sys.modules, "google.cloud.storage", storage)
  patch.setattr(google.cloud, "storage", storage, raising=False)


def uninstall(patch: pytest.MonkeyPatch) -> None:
  from etils.epath import backend

  patch.undo()
  backend.fsspec_backend._get_filesystem.cache_clear()


if __name__ == "__main__":
  root, module, *args = sys.argv[1:]
  install(root, pytest.MonkeyPatch())
  sys.argv = [module, *args]
  runpy.run_module(module, run_name="__main__", alter_sys=True)
