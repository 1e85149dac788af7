"""bert_jax.benchmark, the command and the package: --lockstep without peers is one line, the
fine-tuning mode with its peer skipped, the package's imports (no circle, no config loaded by
path). Each module's own tests are in test_benchmark_<module>.py."""

import ast
import json
import math
import pathlib
import subprocess
import sys

import pytest

from bert_jax.benchmark import (
  finetune_step,
  sizes,
)
from lab._benchmark import PACKAGE

# ----------------------------------------------------------------------------- CLI


def test_lockstep_without_peers_is_a_one_line_error():
  proc = subprocess.run(
    [sys.executable, "-m", "bert_jax.benchmark", "--sizes=tiny", "--lockstep"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
    "benchmark: error: --lockstep needs --peers (with an importable peer) and --isolate"
  )
  assert proc.stdout == ""  # nothing measured, not even the host record


# ----------------------------------------------------------------------------- fine-tuning


@pytest.mark.slow
def test_finetune_mode_runs_with_the_peer_skipped_without_torch(tmp_path):
  """`--task=finetune` times the engine's step (tiny, in this process); a peer interpreter
  without torch is skipped with a note."""
  no_torch = tmp_path / "python"
  no_torch.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # no site-packages
  no_torch.chmod(0o755)
  out = tmp_path / "bench.jsonl"
  argv = [sys.executable, "-m", "bert_jax.benchmark", "--task=finetune", "--sizes=tiny"]
  argv += ["--seqs=32", "--batch=4", "--dtypes=float32", "--steps=2", "--warmup=1", "--passes=1"]
  argv += ["--noisolate"]
  argv += ["--peers", f"--peer_python={no_torch}", f"--json_out={out}"]
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  for fw in ("torch", "torch_compile"):
    assert f"benchmark: peer {fw} is not importable in {no_torch}; skipped" in proc.stderr
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  (r,) = [x for x in lines if x["kind"] == "train_step"]
  assert r["task"] == "finetune" and r["impl"] == "bert_jax" and r["kernels"] == "cpu"
  assert math.isclose(r["examples_per_s"], 4 / (r["step_ms_median"] / 1e3), rel_tol=1e-9)
  assert r["flops_per_token"] == sizes.finetune_flops_per_token(sizes.config_for_size("tiny"), 32)
  # A fresh 2-way classifier: cross-entropy ~ ln 2 on every step.
  assert len(r["losses"]) == 3 and all(abs(x - math.log(2)) < 0.1 for x in r["losses"])
  (s,) = [x for x in lines if x["kind"] == "summary"]
  assert s["task"] == "finetune" and s["ours_best_examples_per_s_median"] == r["examples_per_s"]
  assert "| tiny | 32 | bert_jax | float32 | - | 0 |" in proc.stdout
  assert "| examples/s |" in proc.stdout
  bad = subprocess.run(
    argv[:4] + ["--peers", f"--peer_python={no_torch}", "--peer_list=hf_flax:float32"],
    capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
    "benchmark: error: --peer_list: unknown peer 'hf_flax' for --task=finetune; use torch, "
    "torch_compile"
  )


# ----------------------------------------------------------------------------- the package


def _package_imports(path: pathlib.Path) -> set[str]:
  """Modules of bert_jax.benchmark (and bert_jax's CLI layer) a file imports anywhere in it."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module == "bert_jax.benchmark":
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_jax.benchmark."):
      out.add(node.module.rsplit(".", 1)[1])
    elif isinstance(node, ast.ImportFrom) and node.module == "bert_jax":
      out.update(f"bert_jax.{a.name}" for a in node.names if a.name in ("cli", "main"))
  return out


def test_the_package_imports_form_no_circle_and_load_no_config_by_path():
  graph = {p.stem: _package_imports(p) for p in PACKAGE.glob("*.py")}
  assert graph["finetune_step"] >= {"step"} and "finetune_step" not in graph["step"]
  for name, deps in graph.items():
    if name != "__main__":  # only the CLI entry reaches the CLI layer
      assert not any(d.startswith("bert_jax.") or d == "__main__" for d in deps), (name, deps)
  state: dict[str, int] = {}  # depth-first search: 1 on the stack, 2 done

  def visit(name: str, path: tuple[str, ...]) -> None:
    assert state.get(name) != 1, f"import circle: {' -> '.join(path + (name,))}"
    if state.get(name) == 2:
      return
    state[name] = 1
    for dep in graph.get(name, ()):
      visit(dep, path + (name,))
    state[name] = 2

  for name in graph:
    visit(name, ())
  for p in PACKAGE.glob("*.py"):
    assert "spec_from_file_location" not in p.read_text(), p.name
  assert finetune_step.recipe_module().__name__ == "bert_jax.configs.finetune"
