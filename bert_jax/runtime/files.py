"""Files and paths: local or gs://, written so that a kill or a full disk leaves no half file.

`as_path` checks a path this code can serve (local, or gs:// with its packages) before any
compute; `write_atomic`, `copytree_atomic` and `AtomicDir` write under a temporary name and
rename at the end (an object store has no rename: an upload is all-or-nothing); a temporary
name carries its writer's pid, so `remove_leftovers` can clear what a killed writer left
without touching a live one's. Errors are one line naming the path. Imports no jax or orbax,
so the run-status and resume records use it cheaply.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import importlib.util
import json
import os
import pathlib
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

from etils import epath

PathLike = str | os.PathLike

# Object stores a workdir may live on. gs:// is what orbax serves natively (TensorStore's GCS
# driver for arrays, gcsfs through etils.epath for the rest); other epath schemes (s3://, az://)
# have no orbax array path.
REMOTE_SCHEMES = ("gs",)
# What etils.epath and orbax need for gs:// beyond this package's dependencies: gcsfs (epath's
# fsspec backend; tensorflow's gfile serves instead when installed) and google-cloud-storage
# (orbax asks for the bucket's layout when it deletes an old step).
_GCS_PACKAGES = {"gcsfs": "gcsfs", "google.cloud.storage": "google-cloud-storage"}


def scheme(path: PathLike) -> str | None:
  """'gs' for gs://bucket/x, None for a local path."""
  m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", os.fspath(path))
  return m.group(1).lower() if m else None


def is_remote(path: PathLike) -> bool:
  return scheme(path) is not None


def _missing_gcs_packages() -> list[str]:
  missing = []
  try:
    import fsspec

    fsspec.get_filesystem_class("gcs")  # gcsfs, or whatever implementation is registered
  except (ImportError, ValueError):
    if importlib.util.find_spec("tensorflow") is None:
      missing.append(_GCS_PACKAGES["gcsfs"])
  try:
    importlib.import_module("google.cloud.storage")
  except ImportError:
    missing.append(_GCS_PACKAGES["google.cloud.storage"])
  return missing


def as_path(path: PathLike, what: str = "path") -> epath.Path:
  """`path` as an epath.Path that this code can serve: a local path made absolute (orbax needs
  absolute paths; a URL is never made "absolute" into ./gs:/...), or gs://. Anything else is
  one line (ValueError; ImportError naming the packages gs:// lacks), raised before compute."""
  text = os.fspath(path)
  kind = scheme(text)
  if kind is None:
    return epath.Path(os.path.abspath(text))
  if kind not in REMOTE_SCHEMES:
    raise ValueError(
      f"{what} {text}: the {kind}:// scheme is not supported (a local path or gs://bucket/path)"
    )
  missing = _missing_gcs_packages()
  if missing:
    raise ImportError(
      f"{what} {text}: gs:// needs {' and '.join(missing)} (pip install {' '.join(missing)})"
    )
  return epath.Path(text)


def as_dir(path: PathLike, what: str = "directory") -> epath.Path:
  """`as_path` for a directory a run creates or reuses: a local path that is a file, or lies
  under one, is one line naming it (ValueError), before anything is created."""
  out = as_path(path, what)
  if is_remote(path):  # an object store has no files in the way of a prefix
    return out
  text, probe = os.fspath(path), os.fspath(out)
  while not os.path.exists(probe) and os.path.dirname(probe) != probe:
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    where = "" if probe == os.fspath(out) else f"{probe} "
    raise ValueError(f"{what} {text}: {where}is a file, not a directory")
  return out


def root_cause(error: BaseException) -> str:
  """The innermost exception on one line: TensorStore's own message says what is wrong."""
  while error.__cause__ or error.__context__:
    error = error.__cause__ or error.__context__
  return f"{type(error).__name__}: " + " ".join(str(error).split())


# ----------------------------------------------------------------------------- signals

# Sections a signal must not cut (a lock file created but not yet known as held; a dataset half
# moved into place). A signal handler runs in the main thread between any two bytecodes, so it
# hands its exception to `interrupt`, which raises it now or at the section's end.
_uninterrupted = 0
_pending: list[BaseException] = []


@contextlib.contextmanager
def uninterrupted():
  """A section that `interrupt` (called from a signal handler) does not cut: the exception is
  raised at the end of the outermost section, marked `deferred = True` (what the section did
  is done). If the section itself fails, its error is the one raised."""
  global _uninterrupted
  _uninterrupted += 1
  try:
    yield
  except BaseException:
    if _uninterrupted == 1:
      _pending.clear()
    raise
  finally:
    _uninterrupted -= 1
  if not _uninterrupted and _pending:
    error = _pending.pop()
    error.deferred = True
    raise error


def interrupt(error: BaseException) -> None:
  """Raises `error` from a signal handler, or keeps it for the end of the `uninterrupted`
  section the main thread is in."""
  if _uninterrupted:
    _pending[:] = [error]
    return
  raise error


# ----------------------------------------------------------------------------- leftovers


def process_alive(pid: int) -> bool:
  """Whether a process `pid` runs on this host (in this pid namespace)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, another user's
    return True
  except OverflowError:  # not a pid at all
    return False
  return True


def remove_leftovers(directory: PathLike, prefix: str) -> list[str]:
  """Removes the temporary entries that killed writers left in the local `directory`: those
  named `<prefix><pid>-...` whose process is gone (or `<prefix>...` without a pid: an older
  version's), never this process's own or a live process's. Returns the names removed."""
  removed = []
  try:
    names = os.listdir(directory)
  except OSError:
    return removed
  for name in names:
    if not name.startswith(prefix):
      continue
    head = name[len(prefix) :].split("-", 1)[0]
    if head.isdigit() and (int(head) == os.getpid() or process_alive(int(head))):
      continue
    path = os.path.join(directory, name)
    try:
      shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    except OSError:  # a read-only or foreign directory: left for its owner
      continue
    removed.append(name)
  return removed


def kind_of(path: PathLike) -> str:
  """What a local `path` is, in words ('a regular file', 'a directory', 'a character device',
  'a broken link', ...): for messages about a path that is not what a run expects."""
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError:
    return "a broken link" if os.path.islink(path) else "missing"
  kinds = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
  )
  name = next((n for test, n in kinds if test(mode)), "not a regular file")
  if os.path.islink(path):
    name += f" (a link to {os.path.realpath(path)})"
  return name


def check_regular_file(path: PathLike, what: str) -> None:
  """One line when a local `path` exists but is not a regular file (a directory, a link to
  /dev/full or /dev/zero, whose reading never ends): `what` names what the run keeps there."""
  path = os.fspath(path)
  if is_remote(path) or not os.path.lexists(path):
    return
  kind = kind_of(path)
  if not kind.startswith("a regular file"):
    raise OSError(f"{path} is {kind}, not {what} (a regular file): move it away")


def write_atomic(path: PathLike, text: str) -> None:
  """Writes `text` to `path` under a temporary name, then renames it: a kill or a full disk
  never leaves a partial file. On an object store (no rename) the object is written directly:
  an object upload is all-or-nothing. Errors are one line naming `path`."""
  path = os.fspath(path)
  if is_remote(path):
    try:
      epath.Path(path).write_text(text)
    except Exception as e:  # gcsfs/fsspec raise their own types for HTTP errors
      raise OSError(f"cannot write {path}: {root_cause(e)[:400]}") from None
    return
  tmp = path + ".tmp"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise OSError(f"cannot write {path}: {e.strerror or e}") from None


def copytree_atomic(src: str, dst: PathLike) -> None:
  """Copies the local directory `src` to `dst` unless `dst` is there already: locally under a
  temporary name, then a rename (as `write_atomic`); on an object store file by file, with a
  partial copy (a killed run) counted as absent and done again."""
  dst = os.fspath(dst)
  if is_remote(dst):
    files = sorted(
      os.path.relpath(os.path.join(root, n), src) for root, _, names in os.walk(src) for n in names
    )
    target = epath.Path(dst)
    try:
      done = [
        (target / f).exists()
        and (target / f).stat().length == os.path.getsize(os.path.join(src, f))
        for f in files
      ]
      if all(done):
        return
      for f in files:
        (target / f).write_bytes(epath.Path(src, f).read_bytes())
    except Exception as e:
      raise OSError(f"cannot copy {src} to {dst}: {root_cause(e)[:400]}") from None
    return
  if os.path.isdir(dst):
    return
  tmp = dst.rstrip("/") + ".tmp"
  try:
    if os.path.exists(tmp):  # left by a killed run
      shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    os.replace(tmp, dst)
  except OSError as e:  # shutil.Error too
    shutil.rmtree(tmp, ignore_errors=True)
    raise OSError(f"cannot copy {src} to {dst}: {e.strerror or e}") from None


def exchange(a: PathLike, b: PathLike) -> bool:
  """Swaps the local paths `a` and `b` in one step (Linux renameat2 RENAME_EXCHANGE): no moment
  where either name is missing. False where the system or the file system cannot (then nothing
  changed)."""
  import ctypes

  try:
    fn = ctypes.CDLL(None, use_errno=True).renameat2
  except (OSError, AttributeError):  # not Linux, or a libc before glibc 2.28
    return False
  fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
  at_fdcwd, rename_exchange = -100, 2
  if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
    return True
  err = ctypes.get_errno()
  if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
    return False
  raise OSError(err, os.strerror(err), os.fspath(b))


class AtomicDir:
  """A local output directory written whole or not at all: `with AtomicDir(dst, overwrite) as
  tmp:` writes into a temp dir beside `dst` (`.<name>.tmp-<pid>-*`), put in place only on
  success, which also removes what killed writers of `dst` left beside it. An old `dst` is
  swapped with the new one in one step (`exchange`), so a writer killed at any moment leaves
  the old output or the new one, never none; where the file system cannot swap, the old one is
  first renamed aside (`.<name>.old-<pid>`), and a writer killed between the two renames has
  its old output put back by the next writer of `dst`."""

  def __init__(self, dst: PathLike, overwrite: bool):
    self.dst = pathlib.Path(dst)
    self.overwrite = overwrite

  def _restore_old(self) -> None:
    """A `dst` missing while a dead writer's `.<name>.old-<pid>` is there: put it back."""
    if os.path.lexists(self.dst):
      return
    prefix = f".{self.dst.name}.old-"
    with contextlib.suppress(OSError):
      for name in sorted(os.listdir(self.dst.parent)):
        pid = name[len(prefix) :]
        if name.startswith(prefix) and pid.isdigit() and not process_alive(int(pid)):
          os.rename(self.dst.parent / name, self.dst)
          return

  def __enter__(self) -> pathlib.Path:
    self._restore_old()
    if self.dst.exists() and not self.overwrite:
      raise FileExistsError(f"{self.dst}: already exists (pass overwrite=True / --overwrite)")
    self.dst.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{self.dst.name}.tmp-{os.getpid()}-"
    self.tmp = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=self.dst.parent))
    return self.tmp

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is not None:
      shutil.rmtree(self.tmp, ignore_errors=True)
      return
    # mkdtemp and safetensors create owner-only modes: give the output the usual umask ones.
    umask = os.umask(0)
    os.umask(umask)
    for root, _dirs, files in os.walk(self.tmp):
      os.chmod(root, 0o777 & ~umask)
      for name in files:
        os.chmod(os.path.join(root, name), 0o666 & ~umask)
    if self.dst.is_dir() and not self.dst.is_symlink() and exchange(self.tmp, self.dst):
      shutil.rmtree(self.tmp, ignore_errors=True)  # the old output, now under the temp name
    else:
      old = None
      if os.path.lexists(self.dst):
        old = self.dst.parent / f".{self.dst.name}.old-{os.getpid()}"
        os.rename(self.dst, old)
      os.rename(self.tmp, self.dst)
      if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for kind in ("tmp", "old"):
      remove_leftovers(self.dst.parent, f".{self.dst.name}.{kind}-")


def read_json(path: str | os.PathLike, keys: tuple[str, ...] = ()) -> dict[str, Any]:
  """A JSON object this project wrote (config.json, result.json, task.json, ...) read back;
  an empty, torn or foreign file (not an object, or without `keys`) is one line naming it."""
  path = os.fspath(path)
  check_regular_file(path, "a JSON file")
  try:
    text = epath.Path(path).read_text()
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no such file") from None
  except UnicodeDecodeError:
    raise ValueError(f"{path}: not a JSON file (not UTF-8 text)") from None
  if not text.strip():
    raise ValueError(f"{path}: empty file, not JSON")
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(
      f"{path}: not valid JSON ({e.msg.removesuffix(' at')} at line {e.lineno})"
    ) from None
  if not isinstance(data, dict):
    kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(data))
    raise ValueError(f"{path}: holds a JSON {kind or 'number'}, not an object")
  missing = [k for k in keys if k not in data]
  if missing:
    raise ValueError(f"{path}: no {', '.join(missing)} (not the file this run wrote)")
  return data


# --- text inputs: globs -> files, files -> lines (every reader of a corpus splits lines so)


def read_lines(f, limit: int | None = None, block: int = 1 << 20) -> Iterator[bytes | None]:
  """The lines of binary file `f`, without their ends: "\n", "\r\n" and a lone "\r" (an old
  Mac file) each end a line, as Python's universal newlines, so every reader of a corpus
  (create_data, vocab training) and create_data's own temporary files see the same lines.
  A line of more than `limit` bytes is None, its bytes dropped as they come (bounded memory)."""
  pending = b""
  skipping = False  # inside a line over `limit`
  while chunk := f.read(block):
    lines = (pending + chunk).splitlines(keepends=True)  # bytes: only \n, \r\n and \r
    # The last piece: no line end yet, or a "\r" that may be the first half of "\r\n".
    pending = lines.pop() if not lines[-1].endswith(b"\n") else b""
    for raw in lines:
      line = raw.rstrip(b"\r\n")
      yield None if skipping or (limit and len(line) > limit) else line
      skipping = False
    if limit and len(pending) > limit + 1:
      skipping, pending = True, pending[-1:] if pending.endswith(b"\r") else b""
  if pending.rstrip(b"\r") or skipping:
    line = pending.rstrip(b"\r")
    yield None if skipping or (limit and len(line) > limit) else line
  elif pending:  # a last line of its own: "\r" alone
    yield b""


def expand_inputs(patterns: str, what: str = "--input") -> list[str]:
  """Comma-separated globs -> sorted, de-duplicated files; a glob matching nothing is an error
  naming `what` (the flag or config field that gave the globs)."""
  files: list[str] = []
  for pattern in patterns.split(","):
    pattern = pattern.strip()
    if not pattern:
      continue
    matches = sorted(m for m in glob.glob(os.path.expanduser(pattern), recursive=True))
    matches = [m for m in matches if os.path.isfile(m)]
    if not matches:
      raise FileNotFoundError(f"{what}: no file matches {pattern!r}")
    files.extend(matches)
  if not files:
    raise ValueError(f"{what} is empty")
  return list(dict.fromkeys(files))
