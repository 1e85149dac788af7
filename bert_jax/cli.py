"""What every command-line entry point shares: the Flax examples' `main.py` pattern.

An entry module defines its absl flags at module level (only entry modules define flags), a
`main(argv)`, and

  def run() -> None:  # the console script
    cli.run(main, "create_data")

  if __name__ == "__main__":
    run()

`cli.run` gives every command the same failure behaviour:
- a bad flag, extra arguments, or a config file that does not load (missing file, unknown key,
  wrong type, bad :ARG) ends in one line `PROG: error: ...` and exit status 2, before anything
  is created or computed;
- an error the user can cause at run time (bad input files, paths, configs: ValueError,
  OSError, ImportError for a missing extra, FloatingPointError) ends in one line
  `PROG: error: ...` and exit status 1. BERT_JAX_TRACEBACK=1 shows the traceback instead.

A config flag (`config_flags.DEFINE_config_file`) takes a path (`--config=configs/local.py:mini`)
or the name of a bundled config (`--config=local:mini`): `configs/` ships inside the package as
`bert_jax.configs`, so names work from any directory after a non-editable `pip install`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags
from ml_collections.config_flags import config_flags

from bert_jax import compile_cache

# Errors whose message is all a user needs; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, ImportError, FloatingPointError)


def one_line(error: BaseException | str) -> str:
  """An exception's message on one line (an error raised inside a config's get_config()
  arrives wrapped in a traceback: keep its last line)."""
  text = str(error)
  if "Traceback" in text:
    text = [ln for ln in text.splitlines() if ln.strip()][-1]
  return " ".join(text.replace("\\n", " ").split()) or type(error).__name__


def fail(prog: str, error: BaseException | str, status: int = 1) -> NoReturn:
  """Prints `PROG: error: MESSAGE` to stderr and exits with `status`."""
  print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
  sys.exit(status)


def _closed_pipe() -> NoReturn:
  """`CMD | head` closed our stdout early: not an error of the command."""
  os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
  sys.exit(0)


def config_dir() -> str:
  """The bundled configs: the installed `bert_jax.configs`, else the checkout's `configs/`."""
  spec = importlib.util.find_spec("bert_jax.configs")
  if spec is not None and spec.submodule_search_locations:
    return list(spec.submodule_search_locations)[0]
  return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def bundled_configs() -> dict[str, str]:
  """{name: path} of every bundled config file."""
  root = config_dir()
  names = sorted(os.listdir(root)) if os.path.isdir(root) else []
  return {n[:-3]: os.path.join(root, n) for n in names if n.endswith(".py") and n[0] != "_"}


def resolve_config(value: str) -> str:
  """`NAME[:ARG]` of a bundled config -> `PATH[:ARG]`; a path (it has a '/', ends in '.py', or
  is an existing file) is returned unchanged."""
  path, sep, arg = value.partition(":")
  if "/" in path or os.sep in path or path.endswith(".py") or os.path.isfile(path):
    return value
  configs = bundled_configs()
  if path not in configs:
    raise ValueError(
      f"no config file or bundled config named {path!r} (bundled: {', '.join(configs)})"
    )
  return configs[path] + sep + arg


def resolve_config_args(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """argv with the value of every config flag passed through `resolve_config`."""
  names = {n for n in flag_values if config_flags.is_config_flag(flag_values[n])}
  out, args = list(argv[:1]), iter(argv[1:])
  for arg in args:
    if arg == "--":
      out += [arg, *args]
      break
    key, eq, value = arg.partition("=")
    if key.startswith("-") and key.lstrip("-") in names:
      if eq:
        arg = f"{key}={resolve_config(value)}"
      else:  # `--config NAME`; a missing value is left to absl's error
        out.append(arg)
        arg = next(args, None)
        if arg is None:
          break
        arg = resolve_config(arg)
    out.append(arg)
  return out


def _flags_parser(prog: str) -> Callable[[list[str]], list[str]]:
  def parse(argv: list[str]) -> list[str]:
    try:
      rest = flags.FLAGS(resolve_config_args(argv))
      for name in flags.FLAGS:
        flag = flags.FLAGS[name]
        if config_flags.is_config_flag(flag) and flag.present:
          # config_flags defers a load error to the first attribute access of the value.
          getattr(flag.value, "lock", None)
    except BrokenPipeError:  # `--help | head`
      _closed_pipe()
    except (flags.Error, AttributeError, KeyError, TypeError, *USER_ERRORS) as e:
      fail(prog, e, 2)
    if len(rest) > 1:
      fail(prog, f"unexpected arguments: {' '.join(rest[1:])}", 2)
    return rest

  return parse


def run(main: Callable[[list[str]], None], prog: str, compilation_cache: bool = False) -> None:
  """`app.run(main)` with one-line errors (see the module docstring); with `compilation_cache`,
  a `--compilation_cache_dir` flag and JAX's persistent compilation cache (`compile_cache`)."""
  cache_dir = compile_cache.define_flag() if compilation_cache else None

  def guarded(argv: list[str]) -> None:
    try:
      if cache_dir is not None:
        compile_cache.enable(cache_dir.value)
      main(argv)
    except BrokenPipeError:
      _closed_pipe()
    except USER_ERRORS as e:
      if os.environ.get("BERT_JAX_TRACEBACK"):
        raise
      fail(prog, e)

  app.run(guarded, flags_parser=_flags_parser(prog))
