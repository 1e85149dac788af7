"""The README and docstrings point at things that exist: .ci/run runs the README's test
command, every config and file they name is there, and every link resolves."""

import glob
import os
import pathlib
import re

import pytest

from bert_jax import cli

REPO = str(pathlib.Path(__file__).resolve().parents[2])
DOCS = [
  os.path.join(REPO, "README.md"),
  *glob.glob(os.path.join(REPO, "configs", "*.py")),
  *glob.glob(os.path.join(REPO, "experiments", "*.py")),
  *glob.glob(os.path.join(REPO, "scripts", "*.py")),
  *glob.glob(os.path.join(REPO, "references", "*.py")),
  *glob.glob(os.path.join(REPO, "tools", "**", "*.py"), recursive=True),
  *glob.glob(os.path.join(REPO, "tests", "fixtures", "*.py")),
  *glob.glob(os.path.join(REPO, "docs", "*.md")),
  *glob.glob(os.path.join(REPO, "docs", "notes", "*.md")),
]


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _bash_blocks(text):
  return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
  """CI's first pytest line is the README's test command; the others (the end-to-end tier)
  are commands the README gives too. CI adds only `--durations=25` (the slowest tests)."""
  lines = _read(os.path.join(REPO, ".ci", "run")).splitlines()
  ci = [ln.strip() for ln in lines if "pytest" in ln and not ln.startswith("#")]
  assert ci and all(" --durations=25" in ln for ln in ci), ci
  ci = [ln.replace(" --durations=25", "") for ln in ci]
  readme = _read(os.path.join(REPO, "README.md"))
  commands = [ln.strip() for b in _bash_blocks(readme) for ln in b.splitlines()]
  assert ci and ci[0] in commands
  for line in ci[1:]:
    assert line in commands or f"`{line}`" in " ".join(readme.split()), line


def test_first_command_runs_the_bundled_default():
  first = _bash_blocks(_read(os.path.join(REPO, "README.md")))[0].strip()
  assert "pip install ." in first and "-e" not in first.split("pip install")[1].split("&&")[0]
  (config,) = re.findall(r"--config=(\S+)", first)
  assert config == "local" and config in cli.bundled_configs()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, REPO))
def test_named_configs_and_files_exist(path):
  text = _read(path)
  for value in re.findall(r"--config=([\w./]+)", text):
    if value.endswith(".py"):
      assert os.path.exists(os.path.join(REPO, value)), value
    elif "/" not in value and value not in ("FILE", "PATH"):
      assert value in cli.bundled_configs(), value
  for ref in re.findall(
    r"\b((?:configs|experiments|scripts|references|tools|launch|docs|tests|bert_jax)/[\w/]+\.\w+)",
    text,
  ):
    assert os.path.exists(os.path.join(REPO, ref)), ref


def test_readme_links_resolve():
  text = _read(os.path.join(REPO, "README.md"))
  anchors = {
    re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
    for h in re.findall(r"^#+ (.*)$", text, flags=re.M)
  }
  for target in re.findall(r"\]\(([^)]+)\)", text):
    if target.startswith("#"):
      assert target[1:] in anchors, target
    elif not target.startswith("http"):
      assert os.path.exists(os.path.join(REPO, target)), target


def test_readme_commands_run_from_the_venv():
  """One convention (issue 46, first hour 5): every python, pip or pytest the README's commands
  call is the quick start's `.venv/bin/...` (only `python3 -m venv` makes it), so no example
  runs another environment's interpreter or installs into it."""
  bare = re.compile(r"(?:^|[\s;&|(])((?:python3?|pip3?|pytest)(?:\s|$))")
  readme = _read(os.path.join(REPO, "README.md"))
  lines = [ln.strip() for b in _bash_blocks(readme) for ln in b.splitlines()]
  assert any(".venv/bin/python" in ln for ln in lines)
  for line in lines:
    line = re.sub(r"python3 -m venv|-m (?:pytest|pip)", "", line)  # the venv's own modules
    calls = [m.group(1) for m in bare.finditer(line)]
    assert not calls, f"README runs a bare {calls[0].strip()!r}"
