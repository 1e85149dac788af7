"""bert_jax.benchmark.peer_worker: the peer side's files run without bert_jax."""

import ast
import pathlib
import sys

from bert_jax.benchmark import peers
from lab._benchmark import PACKAGE


def _module_imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
  """Top-level module names a file imports (unconditionally, and under `if __package__`)."""
  always, in_package = set(), set()
  for node in ast.parse(path.read_text()).body:
    blocks = [(node, always)]
    if isinstance(node, ast.If):
      is_pkg = ast.unparse(node.test) == "__package__"
      blocks = [(n, in_package if is_pkg else always) for n in node.body]
      blocks += [(n, always) for n in node.orelse]
    for n, into in blocks:
      if isinstance(n, ast.Import):
        into.update(a.name.split(".")[0] for a in n.names)
      elif isinstance(n, ast.ImportFrom) and n.module:
        into.add(n.module.split(".")[0])
  return always, in_package


def test_peer_side_files_run_without_bert_jax():
  """The peer interpreter runs peer_worker.py by path: at module level it and its siblings
  import only the standard library, numpy and each other (bert_jax only as a package)."""
  stdlib = set(sys.stdlib_module_names) | {"__future__"}
  for name in ("host.py", "protocol.py", "kernel_families.py"):
    always, _ = _module_imports(PACKAGE / name)
    assert always <= stdlib, (name, always - stdlib)
  always, _ = _module_imports(PACKAGE / "batches.py")
  assert always - stdlib == {"numpy"}
  always, in_package = _module_imports(PACKAGE / "peer_worker.py")
  assert always - stdlib == {"numpy", "host", "protocol", "batches", "kernel_families"}
  assert in_package == {"bert_jax"}
  assert peers.peer_argv("PY", {"a": 1}) == ["PY", str(PACKAGE / "peer_worker.py"), '{"a": 1}']
