"""Paper-style results table and loss curves for a directory of runs (e.g. a sweep's --root).

  python -m bert_jax.report --root=/tmp/table5

Every directory under --root holding a `metrics.jsonl` (written by train.py) is a run; its
`config.json` says what it was. The table has one row per run: the config fields that differ
between the runs (the ablated ones), the steps trained, the final train loss (LM loss + NSP
loss, as the trainer prints it), and the last eval's MLM/LTR accuracy and perplexity and NSP
accuracy. It is printed as markdown and written, with loss-curve plots, to --root/report/.
The plots need matplotlib (`pip install 'bert_jax[plots]'`); without it the table is still
written and the command says the plots were skipped.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from absl import flags

from bert_jax import cli

REPORT_DIR = "report"
# Config fields that differ between runs without being an ablation.
_IGNORED_FIELDS = ("data.dir", "init_from")


@dataclass
class Run:
  name: str  # path relative to the root
  config: dict[str, Any]  # flattened: {"objective.nsp": True, ...}
  rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # split -> rows

  def last(self, split: str) -> dict[str, float]:
    return self.rows.get(split, [{}])[-1]

  def steps(self) -> int:
    return max((int(r["step"]) for rs in self.rows.values() for r in rs), default=0)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
  return out


def read_metrics(path: str) -> dict[str, list[dict[str, float]]]:
  """metrics.jsonl -> {split: rows sorted by step}; a bad line is an error naming it."""
  rows: dict[str, list[dict[str, float]]] = {}
  with open(path) as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        split, step = row["split"], int(row["step"])
      except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}:{i}: not a metrics row (JSON with step and split)") from None
      rows.setdefault(split, []).append({**row, "step": step})
  for rs in rows.values():
    rs.sort(key=lambda r: r["step"])
  return rows


def find_runs(root: str) -> list[Run]:
  if not os.path.isdir(root):
    raise FileNotFoundError(f"--root={root}: no such directory")
  runs = []
  for d, dirs, files in os.walk(root):
    dirs[:] = sorted(x for x in dirs if x not in (REPORT_DIR, "checkpoints", "tb", "data"))
    if "metrics.jsonl" not in files:
      continue
    config = {}
    if os.path.isfile(os.path.join(d, "config.json")):
      with open(os.path.join(d, "config.json")) as f:
        try:
          config = flatten(json.load(f))
        except ValueError:
          raise ValueError(f"{os.path.join(d, 'config.json')}: not valid JSON") from None
    name = os.path.relpath(d, root)
    runs.append(Run(name, config, read_metrics(os.path.join(d, "metrics.jsonl"))))
  if not runs:
    raise ValueError(f"--root={root}: no run (a directory with metrics.jsonl) below it")
  return runs


def ablated_fields(runs: list[Run]) -> list[str]:
  """Config fields whose values differ between the runs, in config order."""
  keys: list[str] = []
  for r in runs:
    keys += [k for k in r.config if k not in keys]
  return [
    k for k in keys if k not in _IGNORED_FIELDS and len({repr(r.config.get(k)) for r in runs}) > 1
  ]


def train_loss(row: dict[str, float]) -> float | None:
  """The objective's loss as train.py prints it: LM (MLM or LTR) loss + NSP loss."""
  if "loss" in row:
    return row["loss"]
  lm = row.get("mlm_loss", row.get("ltr_loss"))
  if lm is None:
    return None
  return lm + row.get("nsp_loss", 0.0)


COLUMNS = (
  ("steps", None),
  ("train loss", None),
  ("eval MLM acc", "mlm_accuracy"),
  ("eval MLM ppl", "mlm_perplexity"),
  ("eval LTR acc", "ltr_accuracy"),
  ("eval LTR ppl", "ltr_perplexity"),
  ("eval NSP acc", "nsp_accuracy"),
)


def table(runs: list[Run]) -> tuple[list[str], list[list[Any]]]:
  """(header, rows) with raw values (None where a run has no such metric)."""
  fields = ablated_fields(runs)
  header = ["run", *fields, *(c for c, _ in COLUMNS)]
  rows = []
  for r in runs:
    ev = r.last("eval")
    row = [r.name, *(r.config.get(k) for k in fields), r.steps(), train_loss(r.last("train"))]
    row += [ev.get(key) for _, key in COLUMNS[2:]]
    rows.append(row)
  return header, rows


def _cell(v: Any) -> str:
  if v is None:
    return "–"
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, float):
    return "nan" if math.isnan(v) else f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}"
  return str(v)


def markdown(header: list[str], rows: list[list[Any]]) -> str:
  # Drop metric columns no run has (e.g. LTR columns in a masking sweep).
  keep = [i for i in range(len(header)) if any(r[i] is not None for r in rows) or i == 0]
  lines = ["| " + " | ".join(header[i] for i in keep) + " |"]
  lines.append("|" + "|".join("---" for _ in keep) + "|")
  lines += ["| " + " | ".join(_cell(r[i]) for i in keep) + " |" for r in rows]
  return "\n".join(lines)


def plot(runs: list[Run], out_dir: str) -> list[str]:
  """Train loss, train LM loss and (if any) eval LM loss per step, one line per run.

  Raises ImportError naming the extra when matplotlib is not installed."""
  try:
    import matplotlib
  except ImportError:
    raise ImportError("plots need matplotlib: pip install 'bert_jax[plots]'") from None

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  written = []
  lm_loss = lambda row: row.get("mlm_loss", row.get("ltr_loss"))
  for split, fname, title, value in (
    ("train", "train_loss", "train loss (LM + NSP)", train_loss),
    # Without the NSP term: comparable between runs with and without NSP.
    ("train", "train_lm_loss", "train LM loss (MLM or LTR)", lm_loss),
    ("eval", "eval_loss", "eval LM loss", lm_loss),
  ):
    series = []
    for r in runs:
      pts = [(row["step"], value(row)) for row in r.rows.get(split, [])]
      pts = [(s, v) for s, v in pts if v is not None]
      if pts:
        series.append((r.name, pts))
    if not series:
      continue
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in series:
      ax.plot(*zip(*pts, strict=True), marker="o" if len(pts) < 20 else None, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = os.path.join(out_dir, f"{fname}.png")
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    written.append(path)
  return written


def report(root: str) -> tuple[str, str | None]:
  """Writes the table (root/report/results.md) and the plots; returns the markdown and, when
  the plots were skipped, why."""
  runs = find_runs(root)
  md = markdown(*table(runs))
  out_dir = os.path.join(root, REPORT_DIR)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "results.md")
  with open(path + ".tmp", "w") as f:
    f.write(md + "\n")
  os.replace(path + ".tmp", path)
  try:
    plot(runs, out_dir)
  except ImportError as e:
    return md, str(e)
  return md, None


_ROOT = flags.DEFINE_string("root", None, "Directory holding the runs (e.g. a sweep root).")
flags.mark_flags_as_required(["root"])


def main(argv: list[str]) -> None:
  del argv
  md, skipped = report(_ROOT.value)
  print(md)
  out_dir = os.path.join(_ROOT.value, REPORT_DIR)
  if skipped:
    print(f"\nwritten: {out_dir}/results.md (plots skipped: {skipped})")
  else:
    print(f"\nwritten: {out_dir}/{{results.md,*.png}}")


def run() -> None:
  cli.run(main, "report")


if __name__ == "__main__":
  run()
