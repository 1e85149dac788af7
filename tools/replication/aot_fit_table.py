r"""Whether every experiment point fits a TPU slice at paper scale: one AOT compile per point.

  nice -n 10 python tools/replication/aot_fit_table.py --out=docs/aot_fit.md \
      [--topologies=v5e-16,v4-32,v6e-8] [--only=table5_pretraining_tasks] [--unrolled] \
      [--rows=ROWS.json]   # keep the raw rows (after every compile); --from_rows=ROWS.json
                           # re-renders them; a rerun with --rows reuses the rows there

For every point of every file in experiments/ at `scale=full` (BERT-Base or the Table 6 row's
size, global batch 256 x 128, the paper's phase 1) plus the largest point at phase 2 (256 x 512,
80 predictions), compiles the real train step with `bert_jax.aot.compile_train_step` against
each topology (libtpu's compile-only devices; no TPU needed) and writes a markdown table:
per-device memory / HBM, whether it fits, the mesh. Points whose configs are identical (e.g.
every experiment's baseline is BERT-Base) are compiled once.

Layers are scanned (`model.scan_layers=True`) unless --unrolled: a scanned compile takes
15-35 s instead of 1-3 min on 2 CPU cores, and needs about twice the temporaries of the
unrolled model (NOTES-jax.md section 2), so "fits" here is the conservative answer.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPOLOGIES = ("v5e-16", "v4-32", "v6e-8")
GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class FitPoint:
  experiment: str  # the experiment file's name, e.g. "table5_pretraining_tasks"
  name: str  # the sweep point's name, e.g. "task=mlm", plus " (256 x 512)" for phase 2
  config: Any  # ml_collections.ConfigDict at paper scale


def _load(path: str) -> Any:
  spec = importlib.util.spec_from_file_location("fit_" + os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up while defining
  spec.loader.exec_module(module)
  return module


def paper_points(scan_layers: bool = True, only: str | None = None) -> list[FitPoint]:
  """Every experiment point at scale=full, plus the biggest model's phase 2 (seq 512)."""
  from bert_jax import config_lib

  sweep = _load(os.path.join(REPO, "launch", "sweep.py"))
  out = []
  paths = sorted(glob.glob(os.path.join(REPO, "experiments", "[!_]*.py")))
  # The model-size and objective ablations first: the masking ones compile BERT-Base again.
  paths.sort(key=lambda p: ("masking" in os.path.basename(p), p))
  for path in paths:
    experiment = os.path.basename(path)[:-3]
    if only and experiment not in only.split(","):
      continue
    module = _load(path)
    # One pretraining seed: the seeds' configs differ only in their seeds (the same program).
    for p in sweep.expand(path, "scale=full,seeds=1"):
      config = module.get_config(p.arg)
      config.model.scan_layers = scan_layers
      name = ",".join(i for i in p.name.split(",") if not i.startswith("seed="))
      out.append(FitPoint(experiment, name, config))
  if out:
    largest = max(out, key=lambda p: (p.config.model.hidden_size, p.config.model.num_layers))
    phase2 = config_lib.pretraining_phase(largest.config.copy_and_resolve_references(), 2)
    out.insert(
      out.index(largest) + 1, FitPoint(largest.experiment, largest.name + " (256 x 512)", phase2)
    )
  return out


def _train_size(config: Any) -> int:
  """Layers x width^2 x length: orders points by the memory their train step needs."""
  m = config.model
  return m.num_layers * m.hidden_size**2 * config.data.max_seq_length


def _key(config: Any) -> str:
  return config.to_json_best_effort(sort_keys=True)


def _not_fitting_bytes(message: str) -> float | None:
  """aot's 'does not fit' errors: '... needs 17.20 GiB per device ...' or XLA's
  '... required for HLO temporaries (166.20G) ...'; None when no size is given."""
  m = re.search(r"needs ([\d.]+) GiB", message) or re.search(r"\(([\d.]+)G\)", message)
  return float(m.group(1)) * GiB if m else None


def fit_rows(
  points: list[FitPoint],
  topologies: tuple[str, ...],
  compile_fn: Callable[[Any, str], dict[str, Any]] | None,
  log: Callable[[str], None] = lambda s: None,
  on_rows: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
  known: list[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
  """One row per point x topology: {experiment, point, topology, bytes, hbm_bytes, fits, mesh,
  same_as}. `compile_fn(config, topology)` is aot.compile_train_step's contract: its result
  dict, or ValueError('does not fit ...'). Identical configs are compiled once; `known` rows
  (an earlier run's, same point and topology) are not compiled again; with no compile_fn
  nothing is, and a point x topology neither known nor identical to one known has no row."""
  from bert_jax import aot

  done: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}
  fields = ("bytes", "fits", "mesh", "error")
  earlier = {
    (r["experiment"], r["point"], r["topology"]): {k: r[k] for k in fields if k in r}
    for r in known
    if not r["same_as"]
  }
  rows = []
  for p in points:
    for topology in topologies:
      key = (_key(p.config), topology)
      hbm = aot.TOPOLOGIES[aot.parse_topology(topology)[0]].hbm_bytes
      same_as = ""
      if key in done:
        row, first = done[key]
        same_as = first
      elif (p.experiment, p.name, topology) in earlier:
        row = earlier[(p.experiment, p.name, topology)]
        done[key] = (row, f"{p.experiment} {p.name}")
      elif compile_fn is None:
        continue
      else:
        t0 = time.time()
        try:
          r = compile_fn(p.config, topology)
          row = dict(bytes=r["total_bytes"], fits=r["total_bytes"] <= hbm, mesh=r["mesh"])
        except ValueError as e:
          if not str(e).startswith("does not fit"):
            raise
          row = dict(bytes=_not_fitting_bytes(str(e)), fits=False, mesh=None, error=str(e))
        done[key] = (row, f"{p.experiment} {p.name}")
        log(f"{p.experiment} {p.name} on {topology}: {time.time() - t0:.0f} s")
      rows.append(
        dict(row, experiment=p.experiment, point=p.name, topology=topology, hbm_bytes=hbm)
        | {"same_as": same_as}
      )
      if not same_as:
        on_rows(rows)  # the rows so far: a long run leaves a partial table behind
  return rows


def _error_mesh(message: str) -> dict[str, int] | None:
  """The mesh aot's 'does not fit: TOPOLOGY mesh {...}, batch N: ...' names, if any."""
  m = re.search(r"mesh (\{[^}]*\})", message)
  return ast.literal_eval(m.group(1)) if m else None


def _mesh(mesh: dict[str, int] | None) -> str:
  return "-" if not mesh else " x ".join(f"{k} {v}" for k, v in mesh.items())


def format_table(
  rows: list[dict[str, Any]],
  topologies: tuple[str, ...],
  points: list[FitPoint] = (),
) -> str:
  """Markdown: one line per point (`points`' order first, then any other row's), per topology
  'GiB / HBM GiB, fits, mesh', or 'not compiled' where a stopped run has no row."""
  head = "| experiment | point | " + " | ".join(topologies) + " | compiled |"
  lines = [head, "|" + "---|" * (3 + len(topologies))]
  by_point: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    (p.experiment, p.name): {} for p in points
  }
  for r in rows:
    by_point.setdefault((r["experiment"], r["point"]), {})[r["topology"]] = r
  for (experiment, point), cells in by_point.items():
    out = []
    for t in topologies:
      r = cells.get(t)
      if r is None:  # a partial table: the run stopped before this compile
        out.append("not compiled")
        continue
      used = "?" if r["bytes"] is None else f"{r['bytes'] / GiB:.2f}"
      if "HLO temporaries" in r.get("error", ""):
        used = ">" + used  # XLA's out-of-memory message counts the temporaries alone
      fits = "**fits**" if r["fits"] else "**does not fit**"
      mesh = r["mesh"] or _error_mesh(r.get("error", ""))
      out.append(f"{used} / {r['hbm_bytes'] / GiB:.0f} GiB, {fits}, mesh {_mesh(mesh)}")
    same = {r["same_as"] for r in cells.values()} - {""}
    note = f"same config as {same.pop()}" if same else "yes" if cells else "no"
    lines.append(f"| {experiment} | {point} | " + " | ".join(out) + f" | {note} |")
  return "\n".join(lines)


def write_doc(
  path: str, table: str, command: str, seconds: float, versions: str, missing: int = 0
) -> None:
  partial = ""
  if missing:
    partial = (
      f"\n**Partial**: {missing} cells are not compiled yet (the run was stopped: each compile "
      "took minutes on the shared CPU). The same command with `--rows=FILE` (a rows file it "
      "saved) compiles only those and rewrites this file.\n"
    )
  text = f"""# Ahead-of-time fit of every experiment point on TPU slices

Generated by (from the repository root, on a CPU host with libtpu installed; {seconds / 60:.0f}
min of compiling on 2 shared CPU cores):

    {command}
{partial}
Each cell: per-device memory XLA reports for the compiled train step (arguments + outputs -
donated aliases + temporaries, GiB) / the chip's HBM, whether it fits, and the mesh
(data x fsdp x tensor) the point's config resolves to on that slice. Global batch 256 x 128
(the paper's phase 1) for every point; the largest model also at 256 x 512 (phase 2, 80
predictions per sequence). fp32 params, AdamW, the point's own objective and masking.
Layers are scanned (`model.scan_layers=True`): about twice the temporaries of the unrolled
model, so a "fits" here also holds unrolled. No rematerialisation (the experiments keep the
base recipe's `model.remat_policy="none"`; configs/bert_large.py's `minimal` policy would cut the
temporaries of the big rows). ">X" marks a compile XLA stopped for lack of HBM: X counts its
temporaries alone. Identical configs (each experiment's BERT-Base baseline) are compiled
once. {versions}

{table}
"""
  with open(path, "w") as f:
    f.write(text)


def main(argv: list[str]) -> int:
  opts = {
    "out": "docs/aot_fit.md",
    "topologies": ",".join(TOPOLOGIES),
    "only": None,
    "rows": None,
    "from_rows": None,
  }
  unrolled = False
  for a in argv:
    if a == "--unrolled":
      unrolled = True
    elif a.startswith("--") and "=" in a and a[2:].split("=", 1)[0] in opts:
      k, v = a[2:].split("=", 1)
      opts[k] = v
    else:
      print(f"error: unknown argument {a!r}; see the docstring of {__file__}", file=sys.stderr)
      return 1
  import jax

  # The host stays a CPU backend: libtpu only provides compile-only devices here.
  jax.config.update("jax_platforms", "cpu")
  import libtpu

  from bert_jax import aot

  topologies = tuple(opts["topologies"].split(","))
  for t in topologies:
    aot.parse_topology(t)
  points = paper_points(scan_layers=not unrolled, only=opts["only"])
  if opts["from_rows"]:
    with open(opts["from_rows"]) as f:
      saved = json.load(f)
    rows, seconds, command = saved["rows"], saved["seconds"], saved["command"]
  else:
    args = [a for a in argv if not a.startswith("--rows=")]
    command = " ".join(["nice -n 10 python tools/replication/aot_fit_table.py", *args])

    def save(rows: list[dict[str, Any]]) -> None:
      if opts["rows"]:
        with open(opts["rows"], "w") as f:
          json.dump({"rows": rows, "seconds": time.time() - t0, "command": command}, f, indent=1)

    known, earlier_seconds = [], 0.0
    if opts["rows"] and os.path.exists(opts["rows"]):
      with open(opts["rows"]) as f:
        saved = json.load(f)
      known, earlier_seconds = saved["rows"], saved["seconds"]
    t0 = time.time() - earlier_seconds  # compile time summed over resumed runs
    # The biggest models first: where "fits" is in question, and what a stopped run most needs.
    order = sorted(points, key=lambda p: -_train_size(p.config))
    rows = fit_rows(
      order,
      topologies,
      lambda c, t: aot.compile_train_step(c, t),
      log=lambda s: print(s, flush=True),
      on_rows=save,
      known=known,
    )
    save(rows)
    seconds = time.time() - t0
  # Every point in the table's order, identical configs sharing their rows.
  table = format_table(fit_rows(points, topologies, None, known=rows), topologies, points)
  print(table)
  missing = table.count("not compiled")
  versions = f"jax {jax.__version__}, libtpu {getattr(libtpu, '__version__', '?')}."
  write_doc(opts["out"], table, command, seconds, versions, missing)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
