"""Synthetic pretraining and fine-tuning runs for the tests of bert_jax.report (test_report*.py)."""

import json
import os

import pytest


def _write_run(root, name, config, rows):
  d = os.path.join(root, name)
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


def _config(mlm, nsp, ltr):
  return {
    "seed": 0,
    "objective": {"mlm": mlm, "nsp": nsp, "ltr": ltr},
    "model": {"num_layers": 2, "hidden_size": 128},
    "mesh": {"shape": [1, -1, 1]},
    "data": {"dir": f"/data/{nsp}"},  # differs, but is not an ablation
  }


@pytest.fixture
def sweep_root(tmp_path):
  root = str(tmp_path)
  _write_run(
    root,
    "task=mlm_nsp",
    _config(True, True, False),
    [
      {"step": 10, "split": "train", "mlm_loss": 7.0, "nsp_loss": 0.7, "mlm_accuracy": 0.05},
      {"step": 10, "split": "perf", "steps_per_sec": 3.0},
      {"step": 20, "split": "train", "mlm_loss": 6.0, "nsp_loss": 0.6, "mlm_accuracy": 0.1},
      {
        "step": 20,
        "split": "eval",
        "mlm_loss": 6.1,
        "mlm_accuracy": 0.125,
        "mlm_perplexity": 445.9,
        "nsp_loss": 0.65,
        "nsp_accuracy": 0.625,
      },
    ],
  )
  _write_run(
    root,
    "task=ltr",
    _config(False, False, True),
    [
      {"step": 10, "split": "train", "ltr_loss": 6.5},
      {"step": 30, "split": "train", "ltr_loss": 5.25},
      {"step": 30, "split": "eval", "ltr_loss": 5.5, "ltr_accuracy": 0.2, "ltr_perplexity": 244.7},
    ],
  )
  return root


def _summary(values):
  n = len(values)
  mean = sum(values) / n
  std = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0
  return {"mean": mean, "std": std, "median": sorted(values)[n // 2], "n": n,
          "min": min(values), "max": max(values)}  # fmt: skip


def _write_results(d, task, kind, metric, test, dev=None, summaries=True, init="/ckpt"):
  """A results.json with one seed per value of `test` (and `dev`, default test - 0.01)."""
  dev = dev or [v - 0.01 for v in test]
  os.makedirs(os.path.join(d, "seed_0"), exist_ok=True)
  # A fine-tuning seed logs like a trainer: it must not show up as a pretraining run.
  with open(os.path.join(d, "seed_0", "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 1, "split": "train", "loss": 0.5}) + "\n")
  res = {
    "task": task,
    "kind": kind,
    "init": init,
    "main_metric": metric,
    "seeds": [
      {"seed": i, "dev": {metric: dv}, "test": {metric: tv}}
      for i, (dv, tv) in enumerate(zip(dev, test, strict=True))
    ],
  }
  if summaries:
    res["dev"] = {metric: _summary(dev)}
    res["test"] = {metric: _summary(test)}
  with open(os.path.join(d, "results.json"), "w") as f:
    json.dump(res, f)


@pytest.fixture
def finetune_root(sweep_root):
  ft = lambda point, task: os.path.join(sweep_root, point, "finetune", task)
  rt = [0.838, 0.841, 0.844, 0.839, 0.843]  # mean 0.841, std sqrt(26e-6 / 4) = 0.00255
  _write_results(ft("task=mlm_nsp", "rotten_tomatoes"), "rotten_tomatoes", "classification",
                 "accuracy", rt)  # fmt: skip
  # No summaries in the file: the report computes them from the seeds.
  _write_results(ft("task=mlm_nsp", "vitaminc"), "vitaminc", "classification", "accuracy",
                 [0.59, 0.60, 0.61], summaries=False)  # fmt: skip
  # SQuAD's official F1 is in percent already: shown as is, not x 100.
  _write_results(ft("task=mlm_nsp", "squadshifts"), "squadshifts", "span_qa", "f1",
                 [40.0, 42.0, 44.0], dev=[50.0, 51.0, 52.0])  # fmt: skip
  _write_results(ft("task=ltr", "rotten_tomatoes"), "rotten_tomatoes", "classification",
                 "accuracy", [0.70, 0.72, 0.74])  # fmt: skip
  _write_results(ft("task=ltr", "vitaminc"), "vitaminc", "classification", "accuracy", [0.5])
  return sweep_root


def _seeded_root(tmp_path, points, task="rotten_tomatoes", baseline=None):
  """{point: (config, ppl, [[ft values] per pretraining seed])}: a sweep of seeded points."""
  root = str(tmp_path)
  for name, (config, ppl, per_seed) in points.items():
    for seed, values in enumerate(per_seed):
      point = f"{name},seed={seed}"
      if config is not None:
        _write_run(root, point, {**config, "seed": seed}, [
          {"step": 20, "split": "eval", "mlm_perplexity": ppl[seed], "mlm_accuracy": 0.3},
        ])  # fmt: skip
      d = os.path.join(root, point, "finetune", task)
      _write_results(d, task, "classification", "accuracy", values, init="")
      if baseline:
        with open(os.path.join(d, "results.json")) as f:
          res = json.load(f)
        res["baseline"] = {"name": "majority class", "test": {"accuracy": baseline}}
        with open(os.path.join(d, "results.json"), "w") as f:
          json.dump(res, f)
  return root


T5 = {
  "task=mlm_nsp": (_config(True, True, False), [40.0, 42.0, 41.0],
                   [[0.80, 0.82], [0.81, 0.81], [0.79, 0.80]]),
  "task=mlm": (_config(True, False, False), [39.0, 41.0, 40.0],
               [[0.70, 0.72], [0.71, 0.71], [0.69, 0.70]]),
  "task=ltr": (_config(False, False, True), [0.0] * 3, [[0.60, 0.61]]),  # one pretraining run
  "pretraining=none": (None, None, [[0.50, 0.52], [0.51, 0.53], [0.52, 0.50]]),
}  # fmt: skip


def _size_config(layers, hidden):
  return {"model": {"num_layers": layers, "hidden_size": hidden, "num_heads": 2,
                    "intermediate_size": 4 * hidden, "vocab_size": 100}}  # fmt: skip
