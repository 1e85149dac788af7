"""The fine-tuning engine end to end on small learnable tasks (bert_jax.finetune).

Each task is built from rules a tiny randomly initialised BERT learns in a few dozen steps,
so a broken loss, head, label mapping, batching or evaluation shows as a score near chance.
"""

import gzip
import importlib.util
import json
import os
import pathlib

import numpy as np
import pytest

from bert_jax import config_lib, finetune, model_config
from bert_jax.finetune import data as ft_data
from bert_jax.finetune import grid as ft_grid
from bert_jax.finetune import inputs as ft_inputs
from bert_jax.finetune import seed as ft_seed
from bert_jax.tasks import batches, kinds

REPO = str(pathlib.Path(__file__).resolve().parents[2])
_spec = importlib.util.spec_from_file_location("finetune_config", f"{REPO}/configs/finetune.py")
finetune_config = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(finetune_config)

WORDS = "the a man woman dog cat house city river tree car road book day night sun".split()


def _write(path, rows):
  with gzip.open(path, "wt") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(path)


def _sentences(rng, n, marker_words, p=0.5):
  """Random word sequences; each gets one marker word with probability p (its index, or -1)."""
  out = []
  for _ in range(n):
    words = list(rng.choice(WORDS, rng.integers(3, 9)))
    k = -1
    if rng.random() < p:
      k = int(rng.integers(len(marker_words)))
      words.insert(int(rng.integers(len(words) + 1)), marker_words[k])
    out.append((words, k))
  return out


def _splits(tmp_path, make, sizes=(192, 64, 64)):
  rng = np.random.default_rng(0)
  return [
    _write(tmp_path / f"{s}.jsonl.gz", make(rng, n))
    for s, n in zip(("train", "dev", "test"), sizes, strict=True)
  ]


def tiny_config(task_kind, paths, **task):
  c = finetune_config.get_config("custom,seeds=1,size=tiny")
  c.task.kind = task_kind
  c.task.train, c.task.dev, c.task.test = paths
  for k, v in task.items():
    c.task[k] = v
  c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
  c.data.max_seq_length = 16
  c.data.buckets = (8,)
  c.data.batch_size = 16
  c.data.eval_batch_size = 16
  c.opt.lr = 2e-3
  c.opt.epochs = 4
  c.opt.min_steps = 0
  c.log.every_steps = 1000
  c.ckpt.async_save = False
  return c


def sentiment(rng, n):
  rows = []
  for words, k in _sentences(rng, n, ["good", "bad"], p=1.0):
    rows.append({"sentence": " ".join(words), "label": ["pos", "neg"][k]})
  return rows


def test_batches_cover_every_row_once_and_pad_with_weight_zero():
  rows = [
    {
      "input_ids": np.arange(2, 2 + n, dtype=np.int32),
      "segment_ids": np.zeros(n, np.int32),
      "label": np.int32(n % 2),
    }
    for n in (3, 9, 5, 12, 4)
  ]
  seen = []
  for b in batches.eval_batches(rows, 4, (8, 16), pad_id=0):
    assert b["input_ids"].shape[1] in (8, 16)
    real = b["weight"] > 0
    seen += list(b["row"][real])
    assert (b["row"][~real] == -1).all()
    for i in np.flatnonzero(real):
      n = rows[b["row"][i]]["input_ids"].shape[0]
      assert b["input_mask"][i].sum() == n and (b["input_ids"][i, n:] == 0).all()
  assert sorted(seen) == list(range(5))
  # Training batches: epoch by epoch, each row once per epoch, resumable from any step.
  all_batches = list(zip(range(4), batches.train_batches(rows, 7, 4, 0, (8, 16), 0), strict=False))
  epoch0 = np.concatenate([b["row"][b["weight"] > 0] for _, b in all_batches[:2]])
  assert sorted(epoch0) == list(range(5))
  resumed = next(batches.train_batches(rows, 7, 4, 3, (8, 16), 0))
  np.testing.assert_array_equal(resumed["row"], all_batches[3][1]["row"])


def test_bad_batch_size_is_one_line(tmp_path):
  c = tiny_config("classification", _splits(tmp_path, sentiment, (16, 8, 8)))
  c.data.batch_size = 12  # 8 devices
  with pytest.raises(
    ValueError, match="batch_size=12 is not divisible by the data-parallel size 8"
  ):
    finetune.finetune(c, str(tmp_path / "run"))


CLI_FIELDS = {
  "task.kind": "classification",
  "data.max_seq_length": 16,
  "data.buckets": (8,),
  "data.batch_size": 16,
  "data.eval_batch_size": 16,
  "opt.lr": 0.002,
  "opt.epochs": 2,
  "opt.min_steps": 0,
  "log.every_steps": 1,
  "ckpt.async_save": False,
}


@pytest.mark.parametrize(
  "name,kind,main,labels",
  [
    ("stsb", "regression", "spearman", ()),
    ("mnli", "classification", "accuracy", ("contradiction", "entailment", "neutral")),
    ("cola", "classification", "mcc", ("0", "1")),
  ],
)
def test_glue_presets_read_the_glue_layout(name, kind, main, labels):
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  c = finetune_config.get_config(f"{name},glue_dir={REPO}/tests/fixtures/tasks/glue")
  tok = tokenizer_lib.WordPieceTokenizer.from_file(tokenizer_lib.default_vocab_path())
  task, data = ft_data.load_task_data(c, tok)
  assert (task.kind, task.main_metric) == (kind, main)
  assert set(task.labels) == set(labels)
  assert data["train"][1].rows and data["dev"][1].rows
  test_rows = data["test"][1].rows
  key = "label"
  unlabelled = [r[key] for r in test_rows]
  assert all((np.isnan(v) if kind == "regression" else v == -1) for v in unlabelled)


def test_grid_selects_the_best_mean_dev_point(tmp_path, monkeypatch):
  seen = []

  def fake_run_point(c, wd):
    seen.append((c.opt.lr, c.data.batch_size, c.opt.epochs, os.path.basename(wd)))
    score = {5e-5: 0.8, 3e-5: 0.9, 2e-5: 0.7}[c.opt.lr] - 0.01 * c.opt.epochs
    s = {"mean": score, "std": 0.0, "median": score, "min": score, "max": score, "n": 1}
    return {
      "main_metric": "accuracy",
      "dev": {"accuracy": s},
      "test": {},
      "recipe": {"lr": c.opt.lr},
    }

  monkeypatch.setattr(ft_grid, "run_point", fake_run_point)
  c = finetune_config.get_config("custom,grid=True")
  res = finetune.finetune(c, str(tmp_path))
  assert len(seen) == 18 and len({s[3] for s in seen}) == 18
  assert res["recipe"] == {"lr": 3e-5} and len(res["grid"]) == 18
  assert json.load(open(tmp_path / "results.json"))["recipe"] == {"lr": 3e-5}


@pytest.mark.parametrize(
  "arg, lr, epochs",
  [
    ("rotten_tomatoes", 3e-5, 3),
    ("stsb,size=tiny", 3e-5, 3),
    ("squadshifts", 5e-5, 2),  # the paper's SQuAD v1.1 recipe
    ("wnut16_ner,features=concat_last4", 1e-3, 5),  # only a fresh BiLSTM tagger trains
  ],
)
def test_presets_take_the_pretraining_recipe(arg, lr, epochs):
  """A preset's model, optimizer and mesh are base_config's, but for fine-tuning's lr and an
  epoch schedule (warmup a fraction of the run) in place of pretraining's step counts."""
  c = finetune_config.get_config(arg)
  size = "tiny" if "size=tiny" in arg else "base"
  base = config_lib.base_config(size)
  assert c.model.to_dict() == {**base.model.to_dict(), "dtype": "float32"}
  assert c.mesh.to_dict() == base.mesh.to_dict()
  recipe = {k: v for k, v in base.opt.to_dict().items() if k not in ("warmup_steps", "total_steps")}
  want = {**recipe, "lr": lr, "epochs": epochs, "min_steps": 100, "warmup_fraction": 0.1}
  assert c.opt.to_dict() == want


@pytest.mark.parametrize(
  "rows, batch, epochs, min_steps, want",
  [
    (60, 32, 3, 100, (2, 50, 34)),  # 46's small set: 6 steps -> 100, dev every 17 epochs
    (60, 8, 10, 100, (8, 13, 16)),  # 80 steps -> 104
    (2000, 32, 2, 100, (63, 2, 63)),  # the paper's recipe on 2,000 rows: unchanged
    (60, 32, 3, 0, (2, 3, 2)),  # min_steps=0: opt.epochs
  ],
)
def test_a_small_training_set_trains_at_least_min_steps(rows, batch, epochs, min_steps, want):
  """46, first hour 1: epochs are raised until a seed takes opt.min_steps steps (default 100);
  dev is then evaluated as many times as opt.epochs asked for."""
  c = finetune_config.get_config("custom")
  assert c.opt.min_steps == 100 and (c.opt.lr, c.data.batch_size, c.opt.epochs) == (3e-5, 32, 3)
  c.data.batch_size, c.opt.epochs, c.opt.min_steps = batch, epochs, min_steps
  plan = ft_seed.schedule(c, rows)
  assert (plan.per_epoch, plan.epochs, plan.eval_every) == want
  assert plan.total_steps == want[0] * want[1] >= min(min_steps, want[0] * want[1])
  opt = ft_seed.optimizer_config(c, plan.per_epoch, plan.epochs)
  assert (opt.total_steps, opt.warmup_steps) == (plan.total_steps, round(0.1 * plan.total_steps))


@pytest.mark.parametrize("task", [*finetune_config.SHARED, *finetune_config.GLUE, "custom"])
def test_every_preset_builds(task):
  c = finetune_config.get_config(f"{task},size=tiny")
  assert c.task.kind in kinds.KINDS
  cfg, tok = ft_inputs.model_config(c)
  assert cfg.num_layers == 2 and tok.vocab_size == cfg.vocab_size


@pytest.mark.parametrize(
  "kind,causal", [("classification", False), ("classification", True), ("multiple_choice", False)]
)
def test_pooled_heads_run_the_last_layer_at_the_pooled_token_only(kind, causal):
  """The pruned last layer (queries at the pooled token only) gives the full model's logits."""
  import dataclasses

  import jax
  import jax.numpy as jnp

  from bert_jax.tasks import Task

  cfg = model_config.config_for_size(
    "tiny", vocab_size=64, max_position_embeddings=16, causal=causal
  )
  task = Task("t", kind, ("a", "b", "c") if kind == "classification" else (), ("accuracy",))
  pruned, full = task.model(cfg), task.model(dataclasses.replace(cfg, prune_last_layer=False))
  shape = (3, 2, 12) if kind == "multiple_choice" else (3, 12)
  ids = jax.random.randint(jax.random.key(1), shape, 1, 64)
  lengths = jnp.array([12, 7, 3]).reshape(3, *([1] * (len(shape) - 1)))
  mask = jnp.broadcast_to(jnp.arange(12) < lengths, shape).astype(jnp.int32)
  params = full.init({"params": jax.random.key(0)}, ids, 0 * ids, mask)["params"]
  a = pruned.apply({"params": params}, ids, 0 * ids, mask)
  b = full.apply({"params": params}, ids, 0 * ids, mask)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
