"""JAX's persistent compilation cache, on by default for the trainer, fine-tuning and the
benchmark.

A rerun of the same config loads its compiled train step from disk instead of compiling it
again (minutes for BERT-Base/Large on a GPU or a CPU host). The directory is, in order:
`--compilation_cache_dir` when given ('' or 'none' switches the cache off), else the
JAX_COMPILATION_CACHE_DIR environment variable, else `$XDG_CACHE_HOME/bert_jax/jax_cache`
(`~/.cache/bert_jax/jax_cache`). JAX's own rules apply: only programs that took at least
`jax_persistent_cache_min_compile_time_secs` (1 s) to compile are written, the cache is never
pruned (delete the directory to reclaim the space), and in a multi-process run every process
reads the cache but only process 0 writes it (each host's own directory is fine: the other
hosts' processes then compile as before). A gs:// directory is handed to JAX as is (it reads it
through etils.epath). A local directory that cannot be created or written (a read-only home)
costs one warning line and the run goes on without the cache.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

OFF = ("", "none")
FLAG = "compilation_cache_dir"
# JAX's monitoring events of a compile that asked the cache, and of one it answered.
EVENT_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
EVENT_HIT = "/jax/compilation_cache/cache_hits"

_UNSET = object()
_active: object = _UNSET  # the directory in use, None when off, _UNSET before enable()
_counts = {EVENT_REQUEST: 0, EVENT_HIT: 0}
_listening = False
_thread = threading.local()  # hits of compiles in this thread (JAX reports in the caller's)


def default_dir() -> str | None:
  """JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME (~/.cache)/bert_jax/jax_cache; None when
  neither is set and there is no home directory (no HOME, no passwd entry: a batch job's
  container), where `~` would stay `~`, a directory of that name in the current one."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  root = os.environ.get("XDG_CACHE_HOME")
  if not root:
    home = os.path.expanduser("~")
    if home.startswith("~"):
      return None
    root = os.path.join(home, ".cache")
  return os.path.join(root, "bert_jax", "jax_cache")


def _off(why: str) -> None:
  """The cache off, with one warning line saying why and how to set or silence it."""
  global _active
  import jax

  print(
    f"warning: compilation cache off: {why}; --{FLAG}=DIR sets it, --{FLAG}=none silences this",
    file=sys.stderr,
  )
  jax.config.update("jax_enable_compilation_cache", False)
  _active = None


def define_flag():
  """The `--compilation_cache_dir` flag (absl), for the CLIs that compile train steps."""
  from absl import flags

  if FLAG in flags.FLAGS:  # a second cli.run in one process (tests)
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[FLAG])
  return flags.DEFINE_string(
    FLAG,
    None,
    "JAX's persistent compilation cache: a rerun of the same config loads its compiled step "
    "from here instead of compiling it again. Default: $JAX_COMPILATION_CACHE_DIR, else "
    "~/.cache/bert_jax/jax_cache; '' or 'none' switches it off.",
  )


def _writable(path: str) -> str | None:
  """None if `path` (local) can be created and written, else why not."""
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe"):
      pass
  except OSError as e:
    return e.strerror or type(e).__name__
  return None


def _count(event: str, **kwargs) -> None:
  del kwargs
  if event in _counts:
    _counts[event] += 1
  if event == EVENT_HIT:
    _thread.hits = getattr(_thread, "hits", 0) + 1


def enable(path: str | None = None) -> str | None:
  """Points JAX's persistent compilation cache at `path` (None: `default_dir()`; '' or 'none':
  off). Returns the directory in use, or None when the cache is off. Call it before the first
  compile."""
  global _active, _listening
  import jax

  if path is None:
    path = default_dir()
    if path is None:
      _off("no home directory for ~/.cache (HOME is unset and the user has no passwd entry)")
      return None
  if path.strip().lower() in OFF:
    jax.config.update("jax_enable_compilation_cache", False)
    _active = None
    return None
  if "://" not in path:
    if os.path.expanduser(path).startswith("~"):
      _off(f"cannot expand {path} (no home directory)")
      return None
    path = os.path.abspath(os.path.expanduser(path))
    why = _writable(path)
    if why:
      _off(f"cannot write {path} ({why})")
      return None
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", path)
  if not _listening:
    jax.monitoring.register_event_listener(_count)
    _listening = True
  _active = path
  return path


def active_dir() -> str | None:
  """The directory `enable` set, or None (not called, or the cache is off)."""
  return None if _active is _UNSET else _active


def child_args() -> list[str]:
  """The flag that gives a child CLI process this process's cache setting (none before
  `enable`: the child then takes the default)."""
  return [] if _active is _UNSET else [f"--{FLAG}={_active or 'none'}"]


def thread_hits() -> int:
  """Cache hits of the compiles this thread ran since `enable`."""
  return getattr(_thread, "hits", 0)


def counts() -> dict[str, int]:
  """Compiles that asked the cache ('requests') and those it answered ('hits') since `enable`."""
  return {"requests": _counts[EVENT_REQUEST], "hits": _counts[EVENT_HIT]}
