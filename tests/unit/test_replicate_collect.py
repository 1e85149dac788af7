"""tools/replication/collect.py: the finished runs' small files of a replication root, copied
with each fine-tuning run's trivial baselines, and a report regenerated from the copy."""

import json
import os
import pathlib

import pytest

from bert_jax import report
from unit._collect import collect

REPO = str(pathlib.Path(__file__).resolve().parents[2])


def _write(path, obj):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(obj if isinstance(obj, str) else json.dumps(obj))


def _point(root, name, done=True):
  cfg = {"seed": 0, "objective": {"mlm": True, "nsp": True, "ltr": False}}
  _write(os.path.join(root, name, "config.json"), cfg)
  _write(os.path.join(root, name, "metrics.jsonl"),
         json.dumps({"step": 5, "split": "eval", "mlm_perplexity": 40.0}) + "\n")  # fmt: skip
  _write(os.path.join(root, name, "checkpoints", "5", "big.bin"), "x" * 1000)
  if done:
    _write(os.path.join(root, name, "sweep_done.json"), {"seconds": 1.0})


def _finetune(root, point, task, done=True):
  d = os.path.join(root, point, "finetune", task)
  res = {
    "task": task, "kind": "classification", "main_metric": "accuracy", "init": "",
    "seeds": [{"dev": {"accuracy": 0.6}, "test": {"accuracy": 0.7}}],
    "baseline": {"name": "majority class", "test": {"accuracy": 0.5}, "dev": {"accuracy": 0.4}},
  }  # fmt: skip
  _write(os.path.join(d, "lr0.001_bs32_ep3", "results.json"), res)
  _write(os.path.join(d, "lr0.001_bs32_ep3", "seed_0", "metrics.jsonl"), "{}\n")
  if done:
    _write(os.path.join(d, "results.json"), {**res, "grid": []})
    _write(os.path.join(d, "sweep_done.json"), {"seconds": 1.0})


def test_collect_copies_finished_runs_small_files_and_baselines(tmp_path):
  root, out = tmp_path / "root", tmp_path / "out"
  t5 = str(root / "table5")
  _point(t5, "task=mlm_nsp,seed=0")
  _point(t5, "task=mlm_nsp,seed=1", done=False)  # still training: left out
  _finetune(t5, "task=mlm_nsp,seed=0", "squad_qnli")
  _finetune(t5, "task=mlm_nsp,seed=0", "brown_pos", done=False)  # its grid is not done
  # Table 6's tiny row linked to Table 5's baseline (--reuse): copied as what it links to.
  os.makedirs(root / "table6")
  os.symlink(os.path.join(t5, "task=mlm_nsp,seed=0"), root / "table6" / "row=tiny,seed=0")
  written = collect.collect(str(root), str(out))
  assert sorted(w for w in written if w.startswith("table5")) == sorted(
    os.path.join("table5", "task=mlm_nsp,seed=0", f)
    for f in (
      "config.json", "metrics.jsonl", "sweep_done.json",
      "finetune/squad_qnli/results.json", "finetune/squad_qnli/sweep_done.json",
      "finetune/squad_qnli/baselines.json",
      "finetune/squad_qnli/lr0.001_bs32_ep3/results.json",
      "finetune/squad_qnli/lr0.001_bs32_ep3/baselines.json",
    )
  )  # fmt: skip
  assert (out / "table6" / "row=tiny,seed=0" / "finetune" / "squad_qnli" / "results.json").is_file()
  assert not list(out.rglob("big.bin")) and not list(out.rglob("seed_0"))
  saved = json.load(open(out / "table5/task=mlm_nsp,seed=0/finetune/squad_qnli/baselines.json"))
  assert saved == {"dev": {"majority class": 40.0}, "test": {"majority class": 50.0}}
  md, _ = report.report(str(out / "table5"))
  assert "| task=mlm_nsp | 40.00 |" in md and "| baseline: majority class | – | 50.0 |" in md


def test_splice_replaces_only_the_marked_block(tmp_path):
  doc = tmp_path / "r.md"
  doc.write_text(f"# T\n\nintro\n\n{collect.BEGIN}\nold\n{collect.END}\n\nafter\n")
  collect.splice(str(doc), "## Verdicts\n\n| a |")
  assert doc.read_text() == (
    f"# T\n\nintro\n\n{collect.BEGIN}\n\n### Verdicts\n\n| a |\n\n{collect.END}\n\nafter\n"
  )
  (tmp_path / "none.md").write_text("no markers")
  with pytest.raises(ValueError, match="none.md: no <!-- verdicts"):
    collect.splice(str(tmp_path / "none.md"), "x")


def test_a_named_block_leaves_the_verdicts_block_alone(tmp_path):
  lane_begin, lane_end = collect.markers("qnli lane")
  assert (lane_begin, lane_end) != (collect.BEGIN, collect.END)
  doc = tmp_path / "r.md"
  doc.write_text(f"{collect.BEGIN}\nmain\n{collect.END}\n\n{lane_begin}\nold\n{lane_end}\n")
  collect.splice(str(doc), "lane", lane_begin, lane_end)
  assert doc.read_text() == (
    f"{collect.BEGIN}\nmain\n{collect.END}\n\n{lane_begin}\n\nlane\n\n{lane_end}\n"
  )


walltime = collect.walltime


def test_walltime_pieces_minutes_and_busy_time(tmp_path):
  # Two runs side by side, one stopped (75) and resumed after a pause, one still in progress;
  # lines out of time order (an end appended later) are read in time order.
  t0 = 1_800_000_000
  lines = [
    (t0, "start", "pretrain", "table5", "task=mlm,seed=0"),
    (t0 + 60, "start", "pretrain", "table5", "task=mlm_nsp,seed=0"),
    (t0 + 600, "end", "pretrain", "table5", "task=mlm,seed=0", "75"),
    (t0 + 3600, "start", "pretrain", "table5", "task=mlm,seed=0"),
    (t0 + 4200, "end", "pretrain", "table5", "task=mlm,seed=0", "0"),
    (t0 + 4300, "start", "finetune", "table5", "task=mlm,seed=0"),
    (t0 + 4210, "start", "pretrain", "table5", "task=mlm,seed=0"),  # a driver finds it finished
    (t0 + 4213, "end", "pretrain", "table5", "task=mlm,seed=0", "0"),
    (t0 + 1260, "end", "pretrain", "table5", "task=mlm_nsp,seed=0", "0"),
  ]
  path = tmp_path / "timeline.tsv"
  path.write_text("".join("\t".join(map(str, ln)) + "\n" for ln in lines))
  pieces = walltime.read(str(path))
  assert [(p.point, p.start - t0, p.end and p.end - t0, p.exit) for p in pieces] == [
    ("task=mlm,seed=0", 0, 600, "75"),
    ("task=mlm_nsp,seed=0", 60, 1260, "0"),
    ("task=mlm,seed=0", 3600, 4200, "0"),
    ("task=mlm,seed=0", 4210, 4213, "0"),
    ("task=mlm,seed=0", 4300, None, ""),
  ]
  # Busy: 0-1260 (the two runs overlap) and 3600-4200; the 2340 s pause does not count.
  assert walltime.busy_seconds(pieces) == 1260 + 600 + 3
  md = walltime.markdown(pieces)
  assert "for **31 minutes**" in md
  assert "- pretrain: 40 lane minutes, 2 runs in 4 finished pieces" in md
  row = "| pretrain | table5/task=mlm,seed=0 | 08:00-08:10 (75), 09:00-09:10 (0), 1 under 30 s"
  assert f"{row} (found finished) | 20.1 |" in md
  assert "in progress (no end line): table5/task=mlm,seed=0 (finetune, since 09:11)" in md
  path.write_text("1800000000\tbegin\tpretrain\ttable5\tx\n")
  with pytest.raises(ValueError, match="line 1 is not EPOCH, start|end"):
    walltime.read(str(path))
