"""The verdicts across experiments: `python -m bert_jax.report --root=ROOT --verdicts`, where
ROOT holds one sweep root per experiment (table5, table6, masking, wwm: replicate_cpu.sh's
layout). Every claim line of every experiment's report, the no-pretraining control's once,
judged together (stats.judge: Holm over all of this summary's lines), with each task's
trivial baselines beside the best fine-tuned point, and what is missing (a compared point with
fewer pretraining runs than its experiment's others, a task a point has no result for).
Written to ROOT/report/verdicts.md; docs/replication.md's verdict table is this output.
"""

from __future__ import annotations

import os

from bert_jax.report import claims, stats, tables
from bert_jax.report.runs import REPORT_DIR, find_finetune_runs, find_runs

# Experiment directory -> the published table its claims come from (bert_jax.report --paper).
EXPERIMENTS = {"table5": "table5", "table6": "table6", "masking": "masking", "wwm": "wwm"}
VERDICTS = "verdicts.md"


def _experiment(root: str, split: str):
  runs = find_runs(root, required=False)
  ft = find_finetune_runs(root)
  columns, points = tables.finetune_points(runs, ft, split)
  return runs, ft, columns, tables.arms(points)


def _missing(name: str, runs, columns, arms) -> list[str]:
  """What an experiment's table lacks: pretraining runs, and tasks a point has no result for."""
  out = []
  pretrained: dict[str, int] = {}
  for r in runs:
    arm = tables.split_seed(r.name)[0]
    pretrained[arm] = pretrained.get(arm, 0) + 1
  names = {a.name for a in arms}
  for arm, n in pretrained.items():
    if arm not in names:
      out.append(f"{name}: {arm} pretrained ({n} runs), not yet fine-tuned")
  most = max((len(a.points) for a in arms), default=0)
  tasks = [c.task for c in columns]
  for a in arms:
    if len(a.points) < max(most, pretrained.get(a.name, 0)):
      have = max(most, pretrained.get(a.name, 0))
      out.append(f"{name}: {a.name} fine-tuned for {len(a.points)} of {have} pretraining runs")
    for t in tasks:
      if len(a.values(t)) < len(a.points) and not a.name.startswith("task=ltr_bilstm"):
        out.append(f"{name}: {a.name} has {t} for {len(a.values(t))} of {len(a.points)} runs")
  return out


def summary(root: str, split: str = "test") -> str:
  """The verdict summary's markdown (also written to ROOT/report/verdicts.md)."""
  from bert_jax import report as report_lib  # the package: its baselines' reader

  found = [e for e in EXPERIMENTS if os.path.isdir(os.path.join(root, e))]
  if not found:
    raise ValueError(
      f"--root={root}: none of {', '.join(EXPERIMENTS)} below it (--verdicts reads the root "
      "of tools/replication/replicate_cpu.sh, one sweep root per experiment)"
    )
  lines: list[tuple[str, stats.Line]] = []
  seen: set[tuple] = set()
  missing: list[str] = []
  base: dict[str, dict[str, float]] = {}
  best: dict[str, tuple[float, str, str]] = {}
  for name in found:
    runs, ft, columns, arms = _experiment(os.path.join(root, name), split)
    for ln in claims.claim_lines(EXPERIMENTS[name], columns, arms):
      # The control's lines and the shared baseline repeat between experiments: once each.
      key = (ln.about[:2], tuple(ln.a), tuple(ln.b))
      if key not in seen:
        seen.add(key)
        lines.append((name, ln))
    missing += _missing(name, runs, columns, arms)
    for task, b in report_lib.task_baselines(ft, split).items():
      base.setdefault(task, {}).update(b)
    for c in columns:
      for a in arms:
        if a.name != claims.CONTROL and a.values(c.task):
          mean = tables.mean_sd(a.values(c.task))[0]
          if c.header not in best or mean > best[c.header][0]:
            best[c.header] = (mean, f"{name}/{a.name}", c.task)
  stats.judge([ln for _, ln in lines])
  md = [
    f"## Verdicts ({split} split; {len(lines)} lines, Holm over all of them)",
    "",
    stats.TEST,
    "",
    "| experiment | claim | task (paper column) | points | pretraining runs | difference "
    "[95% interval] | Holm p | verdict |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for name, ln in lines:
    c = ln.comparison
    holm_p = "–" if ln.p_adjusted != ln.p_adjusted else f"{ln.p_adjusted:.3g}"
    claim, column, pair = ln.about
    md.append(
      f"| {name} | {claim} | {column} | {pair} | {c.n_a} vs {c.n_b} | {ln.interval()} "
      f"| {holm_p} | **{ln.verdict}** |"
    )
  md += [
    "",
    "## Trivial baselines and the best fine-tuned point",
    "",
    "| task (paper column) | baselines | best point (mean over pretraining runs) | beats every "
    "baseline |",
    "|---|---|---|---|",
  ]
  for header, (mean, point, task) in best.items():
    b = base.get(task, {})
    names = "; ".join(f"{k} {v:.1f}" for k, v in sorted(b.items())) or "–"
    beats = "–" if not b else "yes" if all(mean > v for v in b.values()) else "**no**"
    md.append(f"| {header} | {names} | {point}: {mean:.1f} | {beats} |")
  if missing:
    md += ["", "## Missing (not yet run or not finished)", ""] + [f"- {m}" for m in missing]
  text = "\n".join(md)
  out = os.path.join(root, REPORT_DIR)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, VERDICTS + ".tmp"), "w") as f:
    f.write(text + "\n")
  os.replace(os.path.join(out, VERDICTS + ".tmp"), os.path.join(out, VERDICTS))
  return text
