"""What every command-line entry point shares: the Flax examples' `main.py` pattern.

An entry module defines its absl flags at module level (only entry modules define flags), a
`main(argv)`, and

  def run() -> None:  # the console script
    cli.run(main, "create_data")

  if __name__ == "__main__":
    run()

`cli.run` gives every command the same behaviour:
- `--help` prints the command's docstring and its own flags and exits 0 (`--helpfull`: every
  flag of every library);
- a bad flag, extra arguments, a config file that does not load (missing file, unknown key,
  wrong type, bad :ARG) or a value the command's `check` refuses (bert_jax.config_schema: a
  choice, a range) ends in one line `PROG: error: ...` and exit status 2, before anything is
  created or computed; so does a `config_schema.ConfigError` raised later (a config that does
  not fit the devices or the data, found before anything is written);
- an error the user can cause at run time (bad input files, paths, configs: ValueError,
  OSError, ImportError for a missing extra, FloatingPointError) ends in one line
  `PROG: error: ...` and exit status 1. BERT_JAX_TRACEBACK=1 shows the traceback instead.

A config flag (`config_flags.DEFINE_config_file`) takes a path (`--config=configs/local.py:mini`)
or the name of a bundled config (`--config=local:mini`): `configs/` ships inside the package as
`bert_jax.configs`, so names work from any directory after a non-editable `pip install`.
A config field that holds a tuple takes a Python tuple (`--config.task.text_fields="('a','b')"`),
repeated flags (`--config.task.text_fields=a --config.task.text_fields=b`) or, where the value
is no Python literal, comma-separated strings (`--config.task.text_fields=title,text`).

Logging is absl's at WARNING (orbax and grain log every read and save at INFO) unless
`--verbosity` is given.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import ml_collections
from absl import app, flags, logging
from ml_collections.config_flags import config_flags, tuple_parser

from bert_jax import config_schema
from bert_jax.runtime import compile_cache

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


class CommaTupleParser(tuple_parser.TupleParser):
  """ml_collections' tuple parser, plus `a,b` -> ('a', 'b'): what a user types for a tuple of
  strings (its parser reads it as the one string 'a,b'). A Python literal (`"('a','b')"`,
  `1,-1,1`) parses as before; an element holding a comma needs the literal form."""

  def parse(self, argument):
    if isinstance(argument, str) and "," in argument:
      try:
        ast.literal_eval(argument)
      except (ValueError, SyntaxError):
        return tuple(part.strip() for part in argument.split(",") if part.strip())
    return super().parse(argument)


# Every config flag's tuple fields (registered for the type, so before any config is parsed).
config_flags.register_flag_parser_for_type(tuple, CommaTupleParser())

_HELP = {"--help", "-help", "-?", "--helpshort", "-helpshort"}
_HELP_FULL = {"--helpfull", "-helpfull"}


def _flag_module(main: Callable) -> str:
  """The name absl files the entry module's flags under: its module's name, or sys.argv[0]
  for `python -m`'s __main__."""
  return sys.argv[0] if main.__module__ == "__main__" else main.__module__


def _help(main: Callable, argv: list[str]) -> None:
  """Prints the entry module's docstring and flags and exits 0 on --help (absl's own help
  exits 1 and, from a console script, lists no flag: it looks them up under sys.argv[0])."""
  args = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
  full = any(a in _HELP_FULL for a in args)
  if not full and not any(a in _HELP for a in args):
    return
  module = sys.modules.get(main.__module__)
  text = (module.__doc__ if module else None) or f"USAGE: {os.path.basename(argv[0])} [flags]"
  listing = flags.FLAGS.get_help() if full else flags.FLAGS.module_help(_flag_module(main))
  try:
    print(text.rstrip() + "\n\nflags:\n" + listing)
    if not full:
      print("\nTry --helpfull to get a list of all flags.")
    sys.stdout.flush()
  except BrokenPipeError:  # `--help | head`
    _closed_pipe()
  sys.exit(0)


def _config_args(argv: list[str], names: set[str]) -> Iterator[tuple[str, str, str]]:
  """(flag, kind, text) of argv's config flags: kind 'file' (text: the value) or 'override'
  (text: the field path of `--config.a.b=v`, `--config.a.b v` or `--noconfig.a.b`)."""
  args = iter(argv[1:])
  for arg in args:
    if arg == "--" or not arg.startswith("-"):
      continue
    key, eq, value = arg.lstrip("-").partition("=")
    if key in names:
      value = value if eq else next(args, "")
      yield key, "file", value
      continue
    for name in names:
      for prefix in (f"{name}.", f"no{name}."):
        if key.startswith(prefix):
          yield name, "override", key[len(prefix) :]


def _unknown_key(config: object, path: str) -> str | None:
  """'unknown config key a.b (did you mean a.c?)' if `path` is not a field of `config`."""
  node, parts = config, path.split(".")
  for i, part in enumerate(parts):
    where = ".".join(parts[:i])
    if not isinstance(node, ml_collections.ConfigDict):
      return f"config key {path}: {where} is a {type(node).__name__}, not a section"
    if part not in node:
      close = difflib.get_close_matches(part, list(node.keys()), n=1)
      hint = f" (did you mean {'.'.join([*parts[:i], close[0]])}?)" if close else ""
      return f"unknown config key {path}{hint}"
    node = node[part]
  return None


def config_error(error: BaseException, argv: list[str], resolved: list[str]) -> str:
  """One line for a config flag that did not load: a missing file, an unknown key (with the
  closest known one), an error raised by the file's get_config(). `resolved`: argv after
  `resolve_config_args` (what was loaded); messages show what the user typed."""
  names = {n for n in flags.FLAGS if config_flags.is_config_flag(flags.FLAGS[n])}
  typed = {n: v for n, k, v in _config_args(argv, names) if k == "file"}
  found = list(_config_args(resolved, names))
  for name, kind, value in found:
    path = value.split(":", 1)[0]
    if kind == "file" and path and not os.path.isfile(path):
      return f"config file {typed.get(name, value).split(':', 1)[0]} not found"
  text = str(error)
  m = re.match(r"flag --(\S+?)=.*?: Error whilst parsing config file", text, re.S)
  if m:  # get_config() raised: its own message, after the config it was given
    last = one_line(text).removeprefix("ValueError: ")
    return f"--{m.group(1)}={typed.get(m.group(1), '')}: {last}"
  if isinstance(error, KeyError | AttributeError):
    for name, kind, value in found:
      if kind != "file":
        continue
      try:
        config = config_flags.ConfigFileFlagParser(name).parse(value)
      except Exception:  # the file's own error is reported below
        break
      for other, k, field in found:
        message = _unknown_key(config, field) if k == "override" and other == name else None
        if message:
          return message
  if isinstance(error, OSError) and "earlier failure to load" in text:
    inner = error.__cause__ or error
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    path = next((v.split(":", 1)[0] for v in typed.values()), "")
    return f"config file {path}: {lines[-1]}"
  return one_line(error)


def _flags_parser(
  prog: str, main: Callable, check: Callable[[], None] | None = None
) -> Callable[[list[str]], list[str]]:
  def parse(argv: list[str]) -> list[str]:
    _help(main, argv)
    try:
      args = resolve_config_args(argv)
    except ValueError as e:  # an unknown bundled config name
      fail(prog, e, 2)
    try:
      rest = flags.FLAGS(args)
      for name in flags.FLAGS:
        flag = flags.FLAGS[name]
        if config_flags.is_config_flag(flag) and flag.present:
          # config_flags defers a load error to the first attribute access of the value.
          getattr(flag.value, "lock", None)
    except BrokenPipeError:  # `--help | head`
      _closed_pipe()
    except (flags.Error, AttributeError, KeyError, TypeError, *USER_ERRORS) as e:
      fail(prog, config_error(e, argv, args), 2)
    if len(rest) > 1:
      fail(prog, f"unexpected arguments: {' '.join(rest[1:])}", 2)
    if check is not None:
      try:
        check()
      except ValueError as e:
        fail(prog, e, 2)
    return rest

  return parse


def check_flag(holder: flags.FlagHolder, check: Callable[[Any], object]) -> None:
  """Runs `check(value)` when the flags are parsed: a ValueError it raises ends the command in
  `PROG: error: flag --NAME=VALUE: MESSAGE`, exit status 2, before `main` runs (a leading
  `--NAME...: ` of the message is dropped, absl names the flag)."""
  name = holder.name

  def validate(value: Any) -> bool:
    try:
      check(value)
    except ValueError as e:
      raise flags.ValidationError(re.sub(rf"^--{name}\b[^:]*: ", "", str(e))) from None
    return True

  flags.register_validator(name, validate)


# The address space a training process reserves (not uses): XLA's and grain's thread stacks
# and arenas. The bundled default (`--config=local`) peaked at 2.9 GB of address space (0.7 GB
# resident, 95 threads) on 2 cores; under `ulimit -v` 2.5 GB it hung in the data reader's
# threads, at 1 GB it died of MemoryError, at 0.7 GB XLA aborted with a C++ stack dump
# (2026-11-28). Below this floor a run is refused in one line instead.
MIN_ADDRESS_SPACE = 4 << 30


def address_space_limit() -> int | None:
  """This process's address-space limit (`ulimit -v`, RLIMIT_AS) in bytes, None if none."""
  import resource

  soft = resource.getrlimit(resource.RLIMIT_AS)[0]
  return None if soft == resource.RLIM_INFINITY else soft


def check_address_space() -> None:
  """An OSError (one line) when `ulimit -v` is below MIN_ADDRESS_SPACE: XLA would abort with a
  C++ stack dump, or the data reader hang, long before the run's memory is used."""
  limit = address_space_limit()
  if limit is not None and limit < MIN_ADDRESS_SPACE:
    raise OSError(
      f"the address-space limit (ulimit -v) is {limit / 2**30:.1f} GiB, below the "
      f"{MIN_ADDRESS_SPACE >> 30} GiB that XLA's and the data reader's threads reserve (a run "
      "uses far less memory than it reserves): raise it (ulimit -v unlimited) and limit "
      "resident memory instead (a cgroup, SLURM --mem)"
    )


def run(
  main: Callable[[list[str]], None],
  prog: str,
  compilation_cache: bool = False,
  check: Callable[[], None] | None = None,
) -> None:
  """`app.run(main)` with one-line errors (see the module docstring); with `compilation_cache`,
  a `--compilation_cache_dir` flag and JAX's persistent compilation cache (`compile_cache`).
  `check()` runs once the flags are parsed, before anything else: a ValueError it raises (e.g.
  `config_schema.check_pretraining(CONFIG.value)`) ends the command with status 2."""
  cache_dir = compile_cache.define_flag() if compilation_cache else None
  if cache_dir is not None:  # --help lists it with the command's own flags
    flags.FLAGS.register_key_flag_for_module(_flag_module(main), flags.FLAGS[cache_dir.name])

  def guarded(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    try:
      if cache_dir is not None:  # a command that compiles with XLA
        check_address_space()
        compile_cache.enable(cache_dir.value)
      main(argv)
    except BrokenPipeError:
      _closed_pipe()
    except MemoryError:
      limit = address_space_limit()
      where = f" (the address-space limit, ulimit -v, is {limit / 2**30:.1f} GiB)" if limit else ""
      fail(prog, f"out of memory{where}")
    except config_schema.ConfigError as e:
      if os.environ.get("BERT_JAX_TRACEBACK"):
        raise
      fail(prog, e, 2)
    except USER_ERRORS as e:
      if os.environ.get("BERT_JAX_TRACEBACK"):
        raise
      fail(prog, e)

  app.run(guarded, flags_parser=_flags_parser(prog, main, check))
