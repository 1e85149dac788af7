"""The package's imports form floors: no module imports one that imports it back, directly or
through others, counting imports inside functions too (a lazy import is the usual way a circle
hides), and nothing imports the top floor (the command lines and the benchmark)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Entry points: nothing else in the package may import them (the benchmark's modules import
# each other, within their own floor).
TOP = ("bert_jax.main", "bert_jax.benchmark")


def _modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
  """{dotted module name: path} of every module of the package under `root`."""
  out = {}
  for p in sorted((root / "bert_jax").rglob("*.py")):
    parts = p.relative_to(root).with_suffix("").parts
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
  return out


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
  """The package module `name` refers to (a module, or the package whose name it is in)."""
  while name and name not in modules:
    name = name.rpartition(".")[0]
  return name or None


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
  """module -> the package modules it imports anywhere in its body."""
  graph: dict[str, set[str]] = {}
  for name, path in modules.items():
    targets = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        found = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
          base = ".".join([*anchor, base] if base else anchor)
        found = [f"{base}.{a.name}" for a in node.names]
      else:
        continue
      for f in found:
        if f.startswith("bert_jax"):
          target = _resolve(f, modules)
          if target and target != name:
            targets.add(target)
    graph[name] = targets
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import circle as [a, b, ..., a], or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return [*path[path.index(nxt) :], nxt]
      if nxt not in state and (cycle := visit(nxt)):
        return cycle
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (cycle := visit(node)):
      return cycle
  return None


def test_the_package_has_no_import_circle():
  cycle = find_cycle(import_graph(_modules()))
  assert cycle is None, "import circle: " + " -> ".join(cycle)


def _top(name: str) -> str | None:
  return next((t for t in TOP if name == t or name.startswith(t + ".")), None)


def test_nothing_imports_the_top_floor():
  graph = import_graph(_modules())
  upward = [(a, b) for a, bs in graph.items() for b in bs if _top(b) and _top(b) != _top(a)]
  assert not upward, f"imports of an entry point from below: {upward}"


def test_the_walk_finds_a_planted_circle(tmp_path):
  """The graph reads module-level and function-level imports, relative ones too."""
  pkg = tmp_path / "bert_jax"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from bert_jax import b\n")
  (pkg / "b.py").write_text("def f():\n  from bert_jax.sub import c\n")
  (pkg / "sub" / "c.py").write_text("from .. import a\n")
  graph = import_graph(_modules(tmp_path))
  assert graph["bert_jax.b"] == {"bert_jax.sub.c"}
  assert graph["bert_jax.sub.c"] == {"bert_jax.a"}
  assert find_cycle(graph) == ["bert_jax.a", "bert_jax.b", "bert_jax.sub.c", "bert_jax.a"]
  del graph["bert_jax.b"]
  assert find_cycle(graph) is None


@pytest.mark.parametrize("name", ["bert_jax.train", "bert_jax.finetune.seed"])
def test_train_and_finetune_have_no_loop_of_their_own(name):
  """The training loop lives in bert_jax/loop.py: train.py and finetune.py hand it a Job."""
  path = _modules()[name]
  tree = ast.parse(path.read_text())
  loops = [n for n in ast.walk(tree) if isinstance(n, ast.While)]
  assert not loops, f"{path.name}:{loops[0].lineno} has a while loop"
  calls = {
    f"{n.func.value.id}.{n.func.attr}"
    for n in ast.walk(tree)
    if isinstance(n, ast.Call)
    and isinstance(n.func, ast.Attribute)
    and isinstance(n.func.value, ast.Name)
  }
  assert "loop.run" in calls


def _public_modules() -> list[str]:
  """Every public module's test name; a package whose __init__ defines nothing is left out."""
  names = []
  for name, path in _modules().items():
    parts = name.split(".")[1:]
    if path.name == "__init__.py" and not any(
      isinstance(n, ast.FunctionDef | ast.ClassDef | ast.Assign)
      for n in ast.parse(path.read_text()).body
    ):
      continue
    if parts and parts[-1] == "__main__":
      parts = parts[:-1]
    if parts and not any(p.startswith("_") for p in parts):
      names.append("_".join(parts))
  return sorted(set(names))


def test_every_public_module_has_a_test_file_of_its_name():
  """Every public module has tests/<tier>/test_<name>.py (<name>: the module's dotted path under
  bert_jax, "." -> "_"; a package: its __init__ or its __main__), none excused."""
  files = {
    p.stem.removeprefix("test_").removesuffix("_e2e") for p in ROOT.glob("tests/*/test_*.py")
  }
  missing = [m for m in _public_modules() if m not in files]
  assert not missing, f"no tests/<tier>/test_<name>.py for: {missing}"


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
  seen, todo = set(), [start]
  while todo:
    for nxt in graph.get(todo.pop(), ()):
      if nxt not in seen:
        seen.add(nxt)
        todo.append(nxt)
  return seen


def test_the_pretraining_trainer_does_not_reach_fine_tuning():
  """Reading any checkpoint (interop) needs no fine-tuning code: the trainer reaches neither
  the task registry nor the fine-tuning package."""
  reached = _reach(import_graph(_modules()), "bert_jax.train")
  assert "bert_jax.interop.loader" in reached  # it does read checkpoints
  fine_tuning = sorted(m for m in reached if m.startswith(("bert_jax.tasks", "bert_jax.finetune")))
  assert not fine_tuning, fine_tuning
