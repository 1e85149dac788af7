"""bert_jax.runtime.compile_cache: a second process compiling the same train step loads it from
JAX's persistent cache; the directory's defaults, switching it off, and an unwritable
directory."""

import os
import subprocess
import sys

import jax
import pytest

from bert_jax.runtime import compile_cache


@pytest.fixture
def config_calls(monkeypatch):
  """jax.config.update recorded, not applied (the session's own cache stays as it is)."""
  calls = {}
  monkeypatch.setattr(jax.config, "update", lambda k, v: calls.__setitem__(k, v))
  monkeypatch.setattr(compile_cache, "_active", compile_cache._UNSET)
  monkeypatch.setattr(compile_cache, "_listening", True)  # no listener from these tests
  return calls


def test_default_dir_honours_the_environment(monkeypatch, tmp_path):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compile_cache.default_dir() == str(tmp_path / "bert_jax" / "jax_cache")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compile_cache.default_dir() == str(tmp_path / "home" / ".cache" / "bert_jax" / "jax_cache")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
  assert compile_cache.default_dir() == "/elsewhere"


def test_enable_off_and_on(config_calls, tmp_path):
  assert compile_cache.child_args() == []  # before enable: children take the default
  for off in ("", "none", "None"):
    assert compile_cache.enable(off) is None
    assert config_calls == {"jax_enable_compilation_cache": False}
  assert compile_cache.child_args() == ["--compilation_cache_dir=none"]
  path = compile_cache.enable(str(tmp_path / "c"))
  assert path == str(tmp_path / "c") and os.path.isdir(path)
  assert config_calls == {"jax_enable_compilation_cache": True, "jax_compilation_cache_dir": path}
  assert compile_cache.active_dir() == path
  assert compile_cache.child_args() == [f"--compilation_cache_dir={path}"]


def test_unwritable_dir_warns_in_one_line_and_goes_on(config_calls, tmp_path, capsys):
  blocker = tmp_path / "a_file"
  blocker.write_text("")  # a directory cannot be made under a file, even by root
  assert compile_cache.enable(str(blocker / "cache")) is None
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "compilation cache off: cannot write" in err
  assert config_calls == {"jax_enable_compilation_cache": False}


def test_remote_dir_goes_to_jax_as_is(config_calls):
  assert compile_cache.enable("gs://bucket/jax_cache") == "gs://bucket/jax_cache"
  assert config_calls["jax_compilation_cache_dir"] == "gs://bucket/jax_cache"


@pytest.mark.parametrize("module", ["bert_jax.main", "bert_jax.finetune", "bert_jax.benchmark"])
def test_the_training_clis_take_the_flag(module):
  r = subprocess.run(
    [sys.executable, "-m", module, "--helpfull"],
    capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )  # fmt: skip
  assert "--compilation_cache_dir" in r.stdout, r.stderr[-500:]  # absl exits 1 after help
