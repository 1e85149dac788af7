"""Named configs: every file in configs/ resolves by name and by path to the same config, and a
built wheel ships them as bert_jax.configs (what `bert_jax_train --config=local` reads after a
non-editable install)."""

import glob
import os
import pathlib
import sys
from unittest import mock

import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax import cli

REPO = str(pathlib.Path(__file__).resolve().parents[2])
NAMES = sorted(
  os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "configs", "[!_]*.py"))
)


def _parse(*args: str):
  """The config that `PROG --config=... args` would get, through cli's flag parsing."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "config", flag_values=fv, lock_config=True)
  argv = ["prog", *args]
  with mock.patch.object(sys, "argv", argv):  # config_flags reads --config.a.b from sys.argv
    fv(cli.resolve_config_args(argv, fv))
    return fv.config


def test_bundled_names():
  assert set(cli.bundled_configs()) == set(NAMES)
  assert {"bert_base", "bert_large", "local"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_name_and_path_give_the_same_config(name, monkeypatch):
  path = os.path.join(REPO, "configs", f"{name}.py")
  assert os.path.samefile(cli.resolve_config(name), path)
  by_name = _parse(f"--config={name}")
  by_path = _parse(f"--config={path}")
  assert by_name.to_dict() == by_path.to_dict()
  monkeypatch.chdir(REPO)  # a checkout-relative path, as the README writes it
  assert _parse(f"--config=configs/{name}.py").to_dict() == by_name.to_dict()
  assert _parse("--config", name).to_dict() == by_name.to_dict()


def test_arg_and_overrides_pass_through(monkeypatch):
  c = _parse("--config=local:size=mini,steps=30", "--config.data.batch_size=4")
  assert (c.model.num_layers, c.opt.total_steps, c.data.batch_size) == (4, 30, 4)
  monkeypatch.chdir(REPO)
  p = _parse("--config=configs/local.py:size=mini,steps=30", "--config.data.batch_size=4")
  assert p.to_dict() == c.to_dict()
  assert cli.resolve_config("bert_base:phase=2").endswith(
    os.path.join("configs", "bert_base.py:phase=2")
  )


def test_paths_are_left_alone(tmp_path, monkeypatch):
  for value in ("configs/local.py", "x/y:z", "mine.py:arg", "/abs/local"):
    assert cli.resolve_config(value) == value
  monkeypatch.chdir(tmp_path)
  (tmp_path / "local").write_text("")  # an existing file wins over the bundled name
  assert cli.resolve_config("local") == "local"


def test_unknown_name_is_one_line():
  with pytest.raises(ValueError, match=r"no config file or bundled config named 'locall'") as e:
    cli.resolve_config("locall:steps=3")
  assert "local" in str(e.value) and "\n" not in str(e.value)
