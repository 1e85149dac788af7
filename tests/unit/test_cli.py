"""The entry points share one pattern: bad flags and user errors end in one line on stderr with
exit status 2 (before any work) or 1; library modules define no absl flags when imported."""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCAL = str(ROOT / "configs" / "local.py")
FINETUNE = str(ROOT / "configs" / "finetune.py")


def _entry_modules() -> set[str]:
  """The console scripts' modules, from whichever packaging file declares them."""
  found = set()
  for name in ("setup.py", "pyproject.toml"):
    path = ROOT / name
    if path.is_file():
      found |= set(re.findall(r"(bert_jax(?:\.\w+)+):\w+", path.read_text()))
  return found


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  env.pop("BERT_JAX_TRACEBACK", None)
  return subprocess.run(
    [sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
  )


@pytest.mark.parametrize(
  "prog, args, status, message",
  [
    ("main", [f"--config={LOCAL}", "--workdir={tmp}/wd", "--config.model.hiden_size=64"], 2,
     "hiden_size"),
    ("main", ["--workdir={tmp}/wd"], 2, "--config must have a value"),
    ("main", ["--config={tmp}/nope.py", "--workdir={tmp}/wd"], 2, "nope.py"),
    ("create_data", ["--input=x.txt", "--output_dir={tmp}/wd", "--max_seq_lenght=64"], 2,
     "max_seq_lenght"),
    ("train_tokenizer", ["--input=x.txt", "--output={tmp}/wd/v.txt", "--kind=bpe"], 2,
     "--kind=bpe: value should be one of"),
    ("train_tokenizer", ["--input=x.txt"], 2, "--output must have a value"),
    ("aot", ["--config={tmp}/nope.py"], 2, "nope.py"),
    ("aot", [f"--config={LOCAL}", "--topology=v9-1"], 2, "flag --topology=v9-1: unknown"),
    ("aot", [f"--config={LOCAL}", "--topology=v5e-17"], 2, "flag --topology=v5e-17: unknown"),
    ("aot", [f"--config={LOCAL}", "--mesh=1,2"], 2, "flag --mesh=1,2: expected three integers"),
    ("benchmark", ["--sizes=tiny,tinny", "--json_out={tmp}/wd/b.jsonl"], 2,
     "unknown size 'tinny'; choose from tiny, mini"),
    ("benchmark", ["--seqs=12x", "--json_out={tmp}/wd/b.jsonl"], 2,
     "'12x' is not a sequence length"),
    ("main", [f"--config={LOCAL}", "--workdir={tmp}/wd", "--config.data.input=missing.txt"], 1,
     "main: error: --config.data.input: no file matches 'missing.txt'"),
    ("report", ["--root={tmp}/wd", "extra"], 2, "unexpected arguments: extra"),
    ("finetune", [f"--config={FINETUNE}:nosuch", "--workdir={tmp}/wd"], 2,
     "unknown fine-tuning task 'nosuch'"),
    ("finetune", [f"--config={FINETUNE}:custom,size=tiny", "--workdir={tmp}/wd/run",
                  "--config.task.train={tmp}/missing.jsonl"], 1, "missing.jsonl"),
  ],
)  # fmt: skip
def test_errors_are_one_line(tmp_path, prog, args, status, message):
  r = _run("-m", f"bert_jax.{prog}", *(a.format(tmp=tmp_path) for a in args))
  lines = r.stderr.strip().splitlines()
  assert r.returncode == status, r.stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), r.stderr[-2000:]
  assert message in lines[0]
  assert not (tmp_path / "wd").exists()


@pytest.mark.parametrize("prog", ["main", "finetune"])
def test_a_workdir_that_is_a_file_is_named(tmp_path, prog):
  """--workdir naming a file, or a path under one: one line saying so (not an errno), exit 1,
  the file as it was."""
  config = LOCAL if prog == "main" else f"{FINETUNE}:custom"
  readme = tmp_path / "README.md"
  readme.write_text("notes\n")
  for workdir, message in [
    (readme, f"--workdir {readme}: is a file, not a directory"),
    (readme / "run", f"--workdir {readme / 'run'}: {readme} is a file, not a directory"),
  ]:
    r = _run("-m", f"bert_jax.{prog}", f"--config={config}", f"--workdir={workdir}")
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"{prog}: error: {message}"]
  assert sorted(os.listdir(tmp_path)) == ["README.md"] and readme.read_text() == "notes\n"


def test_library_modules_define_no_flags():
  """Imports every module but the entry points in a fresh process: no bert_jax module has
  defined an absl flag (the libraries under it may). An import of an entry module anywhere in
  the library makes this fail."""
  entry = _entry_modules()
  assert {"bert_jax.main", "bert_jax.create_data", "bert_jax.train_tokenizer"} <= entry
  code = """
import importlib, json, pkgutil, sys
from absl import flags
import bert_jax

skip = set(sys.argv[1:])
names = [m.name for m in pkgutil.walk_packages(bert_jax.__path__, "bert_jax.")]
names = [n for n in names if n not in skip and not n.endswith(".__main__")]
for n in names:
  importlib.import_module(n)
owners = {m: [f.name for f in fs] for m, fs in flags.FLAGS.flags_by_module_dict().items()}
print(json.dumps({"modules": names, "owners": owners}))
"""
  r = _run("-c", code, *sorted(entry))
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert {"bert_jax.train", "bert_jax.data.pretraining", "bert_jax.tokenizers.training"} <= set(
    out["modules"]
  )
  ours = {m: f for m, f in out["owners"].items() if m.split(".")[0] == "bert_jax"}
  assert not ours, f"importing the library defined flags: {ours}"


# Each command with a flag only it defines.
OWN_FLAG = {
  "main": ("train", "workdir"),
  "finetune": ("finetune", "workdir"),
  "create_data": ("create_data", "output_dir"),
  "train_tokenizer": ("train_tokenizer", "vocab_size"),
  "convert": ("convert", "src"),
  "benchmark": ("benchmark", "sizes"),
  "aot": ("aot", "topology"),
  "report": ("report", "root"),
}


@pytest.mark.parametrize("form", ["python -m", "console script"])
@pytest.mark.parametrize("module", sorted(OWN_FLAG))
def test_help_lists_the_commands_flags(module, form):
  """`--help` prints the command's docstring and its own flags, exit status 0, whether run as
  `python -m bert_jax.X` or as the installed console script (absl's own --help lists no flag
  there: it looks them up under the script's path)."""
  script, flag = OWN_FLAG[module]
  path = f"{module}.__main__" if module in ("benchmark", "finetune", "report") else module
  assert f"bert_jax_{script}=bert_jax.{path}:run" in (ROOT / "setup.py").read_text()
  if form == "python -m":
    r = _run("-m", f"bert_jax.{module}", "--help")
  else:
    exe = pathlib.Path(sys.executable).parent / f"bert_jax_{script}"
    if exe.is_file():  # installed (pip install -e .): the real script
      env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
      r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env, timeout=120)
    else:  # what a console script does: import the module, call run(), argv[0] the script's
      code = (
        f"import sys; sys.argv[0] = 'bert_jax_{script}'; from bert_jax.{path} import run; run()"
      )
      r = _run("-c", code, "--help")
  assert r.returncode == 0, r.stderr[-2000:]
  assert re.search(rf"^  --(\[no\])?{flag}:", r.stdout, re.M), r.stdout[-3000:]
  if module in ("main", "finetune", "benchmark"):  # the README's --compilation_cache_dir
    assert re.search(r"^  --compilation_cache_dir:", r.stdout, re.M), r.stdout[-3000:]
  source = ROOT / "bert_jax" / (path.replace(".", "/") + ".py")  # not imported: it defines flags
  doc = ast.get_docstring(ast.parse(source.read_text()), clean=False)
  assert r.stdout.startswith(doc.strip().splitlines()[0])


@pytest.mark.parametrize("module", sorted(OWN_FLAG) + ["ngram_reference"])
def test_help_says_it_all_on_the_command_line(module, tmp_path):
  """`--help` is all a command line shows: it sends no one to a docstring it cannot show, and a
  config in its examples is a bundled name, which works from any directory (a path such as
  configs/bert_base.py works only in a checkout)."""
  path = f"{module}.__main__" if module in ("benchmark", "report") else module
  r = _run("-m", f"bert_jax.{path}", "--help", cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-2000:]
  text = r.stdout
  assert not re.search(r"package docstring|described in bert_jax\.", text), text[:3000]
  if module in ("main", "aot"):
    configs = re.findall(r"--config=(\S+)", text.split("\nflags:")[0])
    assert configs and all("/" not in c and not c.endswith(".py") for c in configs), configs
    for config in configs:  # each loads here, outside the checkout (refused only for the lr)
      workdir = ["--workdir=wd"] if module == "main" else []
      r = _run("-m", f"bert_jax.{module}", f"--config={config}", *workdir, "--config.opt.lr=-1",
               cwd=tmp_path)  # fmt: skip
      assert r.stderr.strip().endswith("config.opt.lr=-1.0: must be a number > 0 (a learning "
                                       "rate <= 0 does not train)"), r.stderr[-2000:]  # fmt: skip
      assert r.returncode == 2 and list(tmp_path.iterdir()) == []
