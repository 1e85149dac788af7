"""Every file in configs/ and experiments/ builds (every sweep point too), changes only its
ablated fields, and one point of each experiment trains for 2 steps at cpu scale.

The training tests share two small datasets built once from the bundled corpus (with and
without NSP pairs), given to every run as config.data.dir.
"""

import glob
import importlib.util
import inspect
import os
import pathlib
import sys

import pytest

from bert_jax import config_lib, config_schema, objectives, optim, train
from bert_jax import sharding as sh

REPO = str(pathlib.Path(__file__).resolve().parents[2])
# Pretraining configs (configs/finetune.py is the fine-tuning one: tests/unit/test_finetune.py).
CONFIGS = sorted(
  p for p in glob.glob(os.path.join(REPO, "configs", "[!_]*.py")) if not p.endswith("finetune.py")
)
# experiments/_*.py are shared pieces (the downstream suite), not experiments.
EXPERIMENTS = sorted(glob.glob(os.path.join(REPO, "experiments", "[!_]*.py")))
# What each experiment may change between its points (everything else must agree).
ABLATED = {
  "table5_pretraining_tasks": {"objective.mlm", "objective.nsp", "objective.ltr"},
  "table6_model_size": {
    "model.num_layers",
    "model.hidden_size",
    "model.num_heads",
    "model.intermediate_size",
  },
  "masking_static_vs_dynamic": {"masking.mode"},
  "whole_word_masking": {"masking.whole_word"},
}
# What each may change besides at the reduced scales (Table 6: the lr, chosen on tiny, scaled
# by size).
REDUCED_ABLATED = {"table6_model_size": {"opt.lr"}}
# What a pretraining seed changes (config_lib.pretraining_seed), in every experiment.
SEED_FIELDS = {"seed", "data.seed"}


def _load(path):
  name = "cfg_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _points(module, scale="full"):
  """The sweep's points; a sweep(add, arg) may list other points at cpu scale (Table 6)."""
  points = []
  if len(inspect.signature(module.sweep).parameters) > 1:
    module.sweep(lambda **p: points.append(p), f"scale={scale}")
  else:
    module.sweep(lambda **p: points.append(p))
  return points


def _arg(point, **extra):
  return ",".join(f"{k}={v}" for k, v in {**extra, **point}.items())


def _flat(c, prefix=""):
  out = {}
  for k, v in c.items():
    if hasattr(v, "items"):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _check_buildable(c):
  """What train.py derives from a config, without data: fails on a rotten config (a field out
  of its range or without a rule in config_schema too)."""
  config_schema.check_pretraining(c)
  assert config_schema.unchecked_fields(c, config_schema.PRETRAINING) == []
  cfg = train.bert_config(c)
  objectives.Objective.from_config(c)
  optim.make_optimizer(c.opt)
  sh.rules_from_config(c.mesh.rules)
  assert c.masking.mode in ("static", "dynamic")
  assert c.data.max_seq_length <= cfg.max_position_embeddings
  return cfg


def test_every_file_is_known():
  assert {os.path.basename(p)[:-3] for p in EXPERIMENTS} == set(ABLATED)
  assert {"bert_base", "bert_large", "local"} <= {os.path.basename(p)[:-3] for p in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_builds(path):
  module = _load(path)
  assert module.__doc__ and "python -m bert_jax" in module.__doc__
  args = [None] + [_arg(p) for p in _points(module)] if hasattr(module, "sweep") else [None]
  for arg in args:
    _check_buildable(module.get_config(arg))


def test_known_config_args():
  base = _load(os.path.join(REPO, "configs", "bert_base.py"))
  assert train.bert_config(base.get_config("large")).num_layers == 24
  assert base.get_config("phase=2").data.max_seq_length == 512
  large = _load(os.path.join(REPO, "configs", "bert_large.py"))
  assert train.bert_config(large.get_config("phase=2")).hidden_size == 1024


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_experiment_points_change_only_ablated_fields(path):
  module = _load(path)
  name = os.path.basename(path)[:-3]
  for section in ("Hypothesis", "Command", "Result", "not run at full scale"):
    assert section.lower() in module.__doc__.lower(), f"{name}: docstring lacks {section}"
  for scale in ("full", "cpu", "gpu"):
    points = _points(module, scale)
    assert len(points) >= 2
    configs = [module.get_config(_arg(p, scale=scale)) for p in points]
    for c in configs:
      _check_buildable(c)
    flats = [_flat(c) for c in configs]
    changed = {k for k in flats[0] if len({repr(f[k]) for f in flats}) > 1}
    allowed = ABLATED[name] | (REDUCED_ABLATED.get(name, set()) if scale != "full" else set())
    assert changed and changed <= allowed | SEED_FIELDS, (scale, changed)
    # Every point's seed 0 is one of the experiment's configs; the compared points have every
    # pretraining seed, and a seed changes only the seed fields.
    seeds = {}
    for p, f in zip(points, flats, strict=True):
      rest = tuple(sorted((k, v) for k, v in p.items() if k != "seed"))
      seeds.setdefault(rest, {})[p["seed"]] = f
    assert all(0 in s for s in seeds.values())
    assert max(len(s) for s in seeds.values()) == config_lib.PRETRAINING_SEEDS
    for s in seeds.values():
      for seed, f in s.items():
        assert {k for k in f if f[k] != s[0][k]} == (SEED_FIELDS if seed else set())
        assert (f["seed"], f["data.seed"]) == (s[0]["seed"] + seed, s[0]["data.seed"] + seed)
    if scale == "full":
      # Full scale is the paper's recipe: BERT-Base from config_lib, but for the ablation.
      ref = _flat(config_lib.base_config("base"))
      for f in flats:
        assert {k for k in ref if repr(ref[k]) != repr(f[k])} <= ABLATED[name] | SEED_FIELDS
    else:
      assert all(c.data.input.endswith("sample_public_domain.txt") for c in configs)
      assert {c.opt.total_steps for c in configs} == {config_lib.SCALED_STEPS[scale]}
      assert {c.data.batch_size for c in configs} == {config_lib.SCALED_BATCH}
      assert all(train.bert_config(c).num_layers <= 8 for c in configs)
  # The default ARG is one of the points (the baseline).
  default = repr(_flat(module.get_config()))
  assert any(default == repr(_flat(module.get_config(_arg(p)))) for p in _points(module))


def test_experiment_specifics():
  t5 = _load(os.path.join(REPO, "experiments", "table5_pretraining_tasks.py"))
  ltr = t5.get_config("task=ltr,scale=cpu")
  assert (ltr.objective.mlm, ltr.objective.nsp, ltr.objective.ltr) == (False, False, True)
  assert train.bert_config(ltr).causal
  no_nsp = t5.get_config("task=mlm")
  assert (no_nsp.objective.mlm, no_nsp.objective.nsp) == (True, False)
  t6 = _load(os.path.join(REPO, "experiments", "table6_model_size.py"))
  rows = [train.bert_config(t6.get_config(f"row={r}")) for r in t6.ROWS]
  assert [(c.num_layers, c.hidden_size, c.num_heads) for c in rows] == [
    (3, 768, 12), (6, 768, 3), (6, 768, 12), (12, 768, 12), (12, 1024, 16), (24, 1024, 16),
  ]  # fmt: skip
  # cpu scale: L1_H128_A2 / tiny, at one token budget (steps x batch x length).
  cpu = [t6.get_config(_arg(p, scale="cpu")) for p in _points(t6, "cpu") if p["seed"] == 0]
  assert [(c.model.num_layers, c.model.hidden_size, c.model.num_heads) for c in cpu] == [
    (1, 128, 2), (2, 128, 2),
  ]  # fmt: skip
  # The smaller row keeps tiny's lr (not doubled).
  assert [c.opt.lr for c in cpu] == pytest.approx([1.4e-3, 1.4e-3])
  budgets = {c.opt.total_steps * c.data.batch_size * c.data.max_seq_length for c in cpu}
  assert budgets == {config_lib.SCALED_STEPS["cpu"] * 16 * 64}
  assert {c.masking.max_predictions for c in cpu} == {config_lib.SCALED_PREDICTIONS}
  # gpu scale: the same recipe, tiny, L4_H128_A2, L2_H256_A4 and mini, at least 20M tokens per
  # point; the lr is tiny's, halved per doubling of width or depth.
  gpu = [t6.get_config(_arg(p, scale="gpu")) for p in _points(t6, "gpu") if p["seed"] == 0]
  assert [(c.model.num_layers, c.model.hidden_size) for c in gpu] == [
    (2, 128), (4, 128), (2, 256), (4, 256),
  ]  # fmt: skip
  assert [c.opt.lr for c in gpu] == pytest.approx([1.4e-3, 7e-4, 7e-4, 3.5e-4])
  assert {c.opt.lr for c in (t6.get_config(f"row={r}") for r in t6.ROWS)} == {1e-4}
  assert {c.opt.total_steps * c.data.batch_size * c.data.max_seq_length for c in gpu} == {
    config_lib.SCALED_STEPS["gpu"] * 16 * 64
  }
  assert config_lib.SCALED_STEPS["gpu"] * 16 * 64 >= 20_000_000
  # The reduced scales' vocab is trained on the corpus: data=DIR brings its own (DIR/nsp).
  assert {c.model.vocab_size for c in cpu + gpu} == {config_lib.SCALED_VOCAB}
  assert t6.get_config("scale=cpu").model.hidden_size == 128  # the cpu baseline is tiny
  with pytest.raises(ValueError, match="row must be one of L1_H128_A2, tiny, not"):
    t6.get_config("row=mini,scale=cpu")
  # Table 5's rows read the same sentence pairs: only the objective changes.
  t5_dirs = {t5.get_config(f"task={t},scale=cpu,data=/d").data.dir for t in t5.TASKS}
  assert t5_dirs == {"/d/nsp"}
  # Each compared point has 3 pretraining seeds at cpu scale; the others one.
  seeded = lambda m: {
    tuple(v for k, v in p.items() if k != "seed") for p in _points(m, "cpu") if p["seed"] == 2
  }
  assert seeded(t5) == {(t,) for t in t5.TASKS}
  assert seeded(t6) == {("tiny",), ("L1_H128_A2",)}
  masking = _load(os.path.join(REPO, "experiments", "masking_static_vs_dynamic.py"))
  wwm = _load(os.path.join(REPO, "experiments", "whole_word_masking.py"))
  assert seeded(masking) == {("static",), ("dynamic",)}
  assert seeded(wwm) == {(False,), (True,)}
  # At gpu scale tiny and the 256-wide row; the others once.
  gpu_seeded = {p["row"] for p in _points(t6, "gpu") if p["seed"] == 2}
  assert gpu_seeded == {"tiny", "L2_H256_A4"}
  assert {p["mode"] for p in _points(masking, "gpu") if p["seed"] == 2} == {"static"}
  assert {p["whole_word"] for p in _points(wwm, "gpu") if p["seed"] == 2} == {False}
  with pytest.raises(ValueError, match="seed must be >= 0"):
    t5.get_config("seed=-1")
  with pytest.raises(ValueError, match="task must be one of"):
    t5.get_config("task=bilstm")
  with pytest.raises(ValueError, match="scale must be one of full, cpu, gpu"):
    t6.get_config("scale=tpu")


# ----------------------------------------------------------------------------- downstream

TASKS = ["squad_qnli", "brown_pos", "rotten_tomatoes", "vitaminc", "squad_split"]
# No span QA on 2 cores, nor vitaminc (it learns nothing at 1,500 examples there).
CPU_TASKS = ["squad_qnli", "brown_pos", "rotten_tomatoes"]


def _suite(module, point, scale, data=""):
  sys.path.insert(0, REPO)  # experiments/_downstream.py, as launch/sweep.py provides
  try:
    return module.finetune_suite(_arg(point, scale=scale, **({"data": data} if data else {})))
  finally:
    sys.path.remove(REPO)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_every_point_gets_the_same_downstream_suite(path):
  module = _load(path)
  for scale in ("full", "cpu", "gpu"):
    suites = [_suite(module, p, scale) for p in _points(module, scale)]
    # Rows of their own (the control, Table 5's ltr_bilstm) aside, every point runs the same
    # suite.
    own = [[r for r in s if "row" not in r] for s in suites]
    assert all(s == own[0] for s in own)
    assert [r["task"] for r in own[0]] == (CPU_TASKS if scale == "cpu" else TASKS)
    for r in own[0]:
      o = r["overrides"]
      # Selection on dev: every run tries the same lr grid (the control too).
      assert len(o["grid.lr"]) >= 2 and o["seeds"] >= 2 and o["data.max_seq_length"] <= 512
      if scale in ("cpu", "gpu"):
        # Affordable on 2 cores: a subset, few epochs, lengths the cpu pretraining saw.
        assert o["task.max_train_examples"] <= 4000 and o["opt.epochs"] <= 3
        assert o["data.max_seq_length"] <= config_lib.SCALED_LENGTH
      else:
        assert "task.max_train_examples" not in o and o["seeds"] == 5
    # The baseline's every seed has a control row of its own, with the same runs.
    controls = [r for s in suites for r in s if r.get("row", {}).get("pretraining") == "none"]
    seeds = {r["row"]["seed"] for r in controls}
    assert seeds == {p["seed"] for p in _points(module, scale)}
    for c in controls:
      same = next(r for r in own[0] if r["task"] == c["task"])
      assert {k: v for k, v in c["overrides"].items() if k in same["overrides"]} == same[
        "overrides"
      ]
  squad = next(r for r in _suite(module, _points(module)[0], "full") if r["task"] == "squad_split")
  assert squad["overrides"]["data.max_seq_length"] == 384


def test_built_tasks_are_read_from_the_experiments_data():
  t5 = _load(os.path.join(REPO, "experiments", "table5_pretraining_tasks.py"))
  runs = _suite(t5, {"task": "mlm_nsp", "seed": 1}, "cpu", data="/d")
  qnli = next(r for r in runs if r["task"] == "squad_qnli")["overrides"]
  assert qnli["task.train"] == "/d/tasks/squad_qnli/train.jsonl.gz"
  assert qnli["task.test"] == "/d/tasks/squad_qnli/test.jsonl.gz"
  pos = next(r for r in runs if r["task"] == "brown_pos")["overrides"]
  assert pos["task.dev"] == "/d/tasks/brown_pos/dev.jsonl.gz"
  assert "task.train" not in next(r for r in _suite(t5, {"task": "mlm"}, "cpu"))["overrides"]


def test_tasks_argument_picks_the_suites_tasks():
  t5 = _load(os.path.join(REPO, "experiments", "table5_pretraining_tasks.py"))
  runs = _suite(t5, {"task": "mlm_nsp", "seed": 0, "tasks": "squad_qnli+brown_pos"}, "cpu")
  assert [(r["task"], "row" in r) for r in runs] == [
    ("squad_qnli", False), ("brown_pos", False), ("squad_qnli", True), ("brown_pos", True),
  ]  # fmt: skip
  # The pretraining config does not change with it.
  assert t5.get_config("task=mlm,tasks=brown_pos") == t5.get_config("task=mlm")
  with pytest.raises(ValueError, match="tasks=qnli: qnli not among squad_qnli, brown_pos"):
    _suite(t5, {"task": "mlm", "tasks": "qnli"}, "cpu")


def test_table5_ltr_bilstm_reuses_the_ltr_checkpoint():
  t5 = _load(os.path.join(REPO, "experiments", "table5_pretraining_tasks.py"))
  ltr = _suite(t5, {"task": "ltr", "seed": 2}, "gpu")
  plain, bilstm = ltr[: len(TASKS)], ltr[len(TASKS) :]
  # The BiLSTM row: every task again from the same checkpoint, with the BiLSTM head.
  assert [r["task"] for r in plain] == [r["task"] for r in bilstm] == TASKS
  assert {tuple(b["row"].items()) for b in bilstm} == {(("task", "ltr_bilstm"), ("seed", 2))}
  for p, b in zip(plain, bilstm, strict=True):
    assert b["overrides"] == {**p["overrides"], "head.bilstm": True}
  # cpu's suite leaves span QA out, and with it the BiLSTM claim (about SQuAD): no BiLSTM row.
  assert [r["task"] for r in _suite(t5, {"task": "ltr", "seed": 2}, "cpu")] == CPU_TASKS
  assert len(_suite(t5, {"task": "mlm", "seed": 0}, "cpu")) == len(CPU_TASKS)
  # The baseline's suite adds the no-pretraining control: its own row per seed, a random init of
  # the baseline's architecture with the point's tokenizer and fine-tuning seeds of its own.
  base = _suite(t5, {"task": "mlm_nsp", "seed": 1}, "cpu")
  plain, control = base[: len(CPU_TASKS)], base[len(CPU_TASKS) :]
  assert [r["task"] for r in control] == CPU_TASKS
  for p, c in zip(plain, control, strict=True):
    assert c["row"] == {"pretraining": "none", "seed": 1}
    extra = {k: v for k, v in c["overrides"].items() if k not in p["overrides"]}
    assert extra["init"] == "" and extra["data.vocab"] == "{point}/tokenizer"
    assert extra["model.num_layers"] == 2 and extra["model.vocab_size"] == 4096
    assert extra["seed"] == 1 * p["overrides"]["seeds"]  # seed 0's control: 0, 1; seed 1's: 2, 3
  # No pretraining point of its own: the sweep has three, each with its seeds.
  assert [p["task"] for p in _points(t5)] == ["mlm_nsp", "mlm", "ltr"] * 3


# ----------------------------------------------------------------------------- training

SEQ = 64


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
  """{nsp: data dir}: the bundled corpus (its first 1,500 lines) with and without NSP."""
  from bert_jax.data import pretraining as pretraining_data

  root = tmp_path_factory.mktemp("experiment_data")
  corpus = os.path.join(REPO, "bert_jax", "data", "sample_public_domain.txt")
  with open(corpus) as f:
    lines = f.readlines()[:1500]
  small = root / "corpus.txt"
  small.write_text("".join(lines))
  out = {}
  for nsp in (True, False):
    out[nsp] = str(root / f"nsp_{nsp}")
    pretraining_data.build(
      str(small), out[nsp], max_seq_length=SEQ, nsp=nsp, eval_fraction=0.1, progress=False,
      num_workers=0,
    )  # fmt: skip
  return out
