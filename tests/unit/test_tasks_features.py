"""The feature-based mode (bert_jax/tasks/features.py): the frozen encoder's chosen hidden
states computed once, a BiLSTM tagger trained on them through the fine-tuning engine."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import model as model_lib
from bert_jax import model_config, optim
from bert_jax import sharding as sh
from bert_jax.finetune import data as ft_data
from bert_jax.finetune import inputs as ft_inputs
from bert_jax.finetune import seed as ft_seed
from bert_jax.tasks import batches, encode, features
from unit._finetune_tasks import _sentences, _splits, finetune_config, tiny_config


def cities(rng, n):
  rows = []
  for words, _ in _sentences(rng, n, ["paris", "london"], p=1.0):
    rows.append(
      {"tokens": words, "tags": ["B-LOC" if w in ("paris", "london") else "O" for w in words]}
    )
  return rows


@pytest.mark.parametrize("row", list(features.ROWS))
def test_each_table7_row_selects_its_hidden_states(row):
  """Each row's stored features equal BertModel's hidden_states at the row's indices
  (0 embeddings, 1..5 the layers of a 5-layer model), row by row, unpadded."""
  c = finetune_config.get_config(f"custom,features={row},size=tiny")
  c.data.max_seq_length, c.data.buckets, c.data.eval_batch_size = 16, (), 8
  cfg = model_config.BertConfig(**{**c.model.to_dict(), "num_layers": 5, "hidden_size": 32})
  cfg = dataclasses.replace(cfg, num_heads=2, intermediate_size=64)
  want = {
    "embeddings": [0],
    "second_to_last": [4],
    "last": [5],
    "sum_last4": [2, 3, 4, 5],
    "concat_last4": [2, 3, 4, 5],
    "sum_all": [1, 2, 3, 4, 5],
  }[row]
  assert list(features.resolve_layers(c.features, 5)) == want
  assert c.features.combine == ("weighted_sum" if row.startswith("sum") else "concat")
  rng = np.random.default_rng(0)
  rows = [
    {"input_ids": rng.integers(5, 100, n).astype(np.int32), "segment_ids": np.zeros(n, np.int32)}
    for n in (3, 11, 7)
  ]
  ids = jnp.zeros((1, 4), jnp.int32)
  params = model_lib.BertModel(cfg).init(jax.random.key(1), ids, ids, ids)["params"]
  mesh = sh.make_mesh((1, -1, 1))
  data = {"train": ft_data.Split(None, encode.Encoded(rows, 3, 0)), "dev": None, "test": None}
  info = features.add_features(c, cfg, params, data, 0, mesh, sh.DEFAULT_RULES)
  assert info["layers"] == want
  for r in rows:
    x = jnp.asarray(r["input_ids"])[None]
    out = model_lib.BertModel(cfg).apply(
      {"params": params}, x, jnp.zeros_like(x), jnp.ones_like(x), output_hidden_states=True
    )
    expect = np.stack([out["hidden_states"][i][0] for i in want], axis=1)
    assert r["features"].shape == (len(r["input_ids"]), len(want), 32)
    np.testing.assert_allclose(r["features"], expect, atol=2e-5)


def test_layer_out_of_range_and_unknown_row_are_one_line():
  c = finetune_config.get_config("custom,features=concat_last4,size=tiny")
  with pytest.raises(ValueError, match=r"-4 is out of range for a 2-layer model \(0..2"):
    features.resolve_layers(c.features, 2)
  with pytest.raises(ValueError, match="unknown Table-7 row features='top'"):
    finetune_config.get_config("custom,features=top")
  c = finetune_config.get_config("rotten_tomatoes,features=last")
  with pytest.raises(ValueError, match="tags tokens; task kind is classification"):
    features.check(c, c.task.kind)


def test_train_state_holds_the_tagger_only_and_the_scalar_mix_trains(tmp_path):
  """No encoder params and no optimizer state for them; one step moves the mix weights and
  gamma (they get gradients) from their init (0, 1)."""
  c = tiny_config("tagging", _splits(tmp_path, cities, (16, 8, 8)))
  c.features.update(features.ROWS["sum_all"])
  cfg, tokenizer = ft_inputs.model_config(c)
  task, data = ft_data.load_task_data(c, tokenizer)
  mesh = sh.make_mesh((1, -1, 1))
  features.add_features(c, cfg, None, data, tokenizer.pad_id, mesh, sh.DEFAULT_RULES)
  model = features.model(c, cfg, task)
  tx = optim.make_optimizer(ft_seed.optimizer_config(c, 1))
  init = ft_seed.state_init_fn(model, tx, 8)
  state, _, _ = sh.init_sharded(init, mesh, sh.DEFAULT_RULES, jax.random.key(0))
  params = state["params"]
  assert set(params) == {"head"}
  assert set(params["head"]) == {"scalar_mix", "bilstm_0", "bilstm_1", "classifier"}
  assert params["head"]["scalar_mix"]["weights"].shape == (2,)  # both layers of tiny
  n_head = sum(x.size for x in jax.tree.leaves(params))
  n_opt = sum(x.size for x in jax.tree.leaves(state["opt_state"]))
  assert 2 * n_head <= n_opt < 2 * n_head + 16  # Adam's two moments of the head, counters
  batch = batches.collate(data["train"][1].rows, np.arange(16), 16, (16,), tokenizer.pad_id)
  assert batch["features"].shape == (16, 16, 2, 128)
  step = jax.jit(ft_seed.make_train_step(model, tx, task))
  state, m = step(state, batch, jax.random.key(1))
  mix = state["params"]["head"]["scalar_mix"]
  assert float(m["loss"]) > 0
  assert np.abs(np.asarray(mix["weights"])).max() > 0 and float(mix["gamma"]) != 1.0


def test_bfloat16_features_match_float32(tmp_path):
  """dtype=bfloat16 halves the stored features; the values stay within bf16 rounding."""
  c = tiny_config("tagging", _splits(tmp_path, cities, (24, 8, 8)))
  c.features.update(features.ROWS["last"])
  cfg = model_config.BertConfig(**c.model.to_dict())
  mesh = sh.make_mesh((1, -1, 1))
  out = {}
  for dtype in ("float32", "bfloat16"):
    c.features.dtype = dtype
    task, data = ft_data.load_task_data(c, ft_inputs.model_config(c)[1])
    features.add_features(c, cfg, None, data, 0, mesh, sh.DEFAULT_RULES)
    out[dtype] = [r["features"] for r in data["train"][1].rows]
  assert out["bfloat16"][0].dtype == jnp.bfloat16
  assert sum(x.nbytes for x in out["bfloat16"]) * 2 == sum(x.nbytes for x in out["float32"])
  for a, b in zip(out["float32"], out["bfloat16"], strict=True):
    np.testing.assert_allclose(b.astype(np.float32), a, rtol=1e-2, atol=1e-2)
