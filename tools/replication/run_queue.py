"""The replication's runs in the order tools/replication/replicate_{cpu,gpu}.sh's lanes take
them: one `EXPERIMENT POINT` a line (a launch/sweep.py --only of that experiment).

  python tools/replication/run_queue.py --data=DIR [--scale=cpu]

The compared points first, the cheapest (by `step_cost`) with all their seeds first, so that
a run stopped early has whole comparisons of 3 runs a side for the cheap points; the points
pretrained once (an observation, never a verdict) after the compared ones; each pretraining
config once (Table 6's tiny row, static masking and
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
  cost: dict[str, float] = {}
  for _, exp, name, base in found:
    seeds_of[(exp, base)] = seeds_of.get((exp, base), 0) + 1
    cost[name] = step_cost(sweep.load_experiment(os.path.join(REPO, EXPERIMENTS[exp])), name, scale)
  # The compared points before those pretrained once; the cheaper points first, all their
  # seeds (so that the first verdicts, on 3 runs a side, come early).
  order = sorted(found, key=lambda r: (seeds_of[(r[1], r[3])] == 1, cost[r[2]], r[0]))
  return [(exp, name) for _, exp, name, _ in order]


def step_cost(module, name: str, scale: str) -> float:
  """A point's pretraining step cost relative to tiny MLM's, from its size and objective: the
  encoder's matmuls grow with layers x hidden^2; LTR predicts every position (about 2.5 times
  tiny MLM's step on the 2-core VM, docs/replication.md)."""
  c = module.get_config(f"scale={scale},{name}")
  size = (c.model.hidden_size / 128) ** 2 * c.model.num_layers / 2
  return round(size * (2.5 if c.objective.ltr else 1.0), 3)


def main(argv: list[str]) -> None:
  del argv
  for exp, name in runs(_SCALE.value, _DATA.value):
    print(exp, name)


if __name__ == "__main__":
  app.run(main)
