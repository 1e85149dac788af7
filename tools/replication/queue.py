"""The replication's runs in the order tools/replication/replicate_{cpu,gpu}.sh's lanes take
them: one `EXPERIMENT POINT` a line (a launch/sweep.py --only of that experiment).

  python tools/replication/queue.py --data=DIR [--scale=cpu]

Seed by seed (every compared point's seed 0, then seed 1, ...), so that a run stopped early
has whole comparisons first; the points pretrained once (an observation, never a verdict) come
after the compared ones; each pretraining config once (Table 6's tiny row, static masking and
the masking-pieces row are Table 5's baseline: their sweeps link it with --reuse).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "launch"))
import sweep  # noqa: E402

EXPERIMENTS = {
  "table5": "experiments/table5_pretraining_tasks.py",
  "table6": "experiments/table6_model_size.py",
  "masking": "experiments/masking_static_vs_dynamic.py",
  "wwm": "experiments/whole_word_masking.py",
}

_DATA = flags.DEFINE_string("data", "", "The experiments' data=DIR (build_data.sh's output).")
_SCALE = flags.DEFINE_enum("scale", "cpu", ["cpu", "gpu", "full"], "The experiments' scale.")


def runs(scale: str, data: str) -> list[tuple[str, str]]:
  """[(experiment, point name)] in queue order."""
  seen: set[str] = set()
  found: list[tuple[int, str, str, str]] = []  # (seed, experiment, point, point without seed)
  for exp, rel in EXPERIMENTS.items():
    path = os.path.join(REPO, rel)
    arg = f"scale={scale}" + (f",data={data}" if data else "")
    for p in sweep.expand(path, arg):
      key = sweep.pretraining_key(path, p, [])
      if key in seen:
        continue
      seen.add(key)
      items = dict(item.split("=", 1) for item in p.name.split(","))
      seed = int(items.pop("seed"))
      found.append((seed, exp, p.name, ",".join(f"{k}={v}" for k, v in items.items())))
  seeds_of: dict[tuple[str, str], int] = {}
  for _, exp, _, base in found:
    seeds_of[(exp, base)] = seeds_of.get((exp, base), 0) + 1
  order = sorted(found, key=lambda r: (seeds_of[(r[1], r[3])] == 1, r[0]))
  return [(exp, name) for _, exp, name, _ in order]


def main(argv: list[str]) -> None:
  del argv
  for exp, name in runs(_SCALE.value, _DATA.value):
    print(exp, name)


if __name__ == "__main__":
  app.run(main)
