"""bert_jax.trees: nested dicts <-> flat {path: leaf} dicts, for param trees ("/") and configs
(".")."""

import numpy as np

from bert_jax import trees


def test_flatten_and_unflatten_are_inverse():
  leaf = np.zeros(3)
  tree = {"bert": {"encoder": {"layer_0": {"kernel": leaf, "bias": 1}}, "pooler": {"w": 2}},
          "cls": {"bias": 3}}  # fmt: skip
  flat = trees.flatten(tree)
  assert flat == {
    "bert/encoder/layer_0/kernel": leaf,
    "bert/encoder/layer_0/bias": 1,
    "bert/pooler/w": 2,
    "cls/bias": 3,
  }
  assert flat["bert/encoder/layer_0/kernel"] is leaf  # the leaves themselves, not copies
  assert trees.unflatten(flat) == tree


def test_configs_flatten_with_dots_and_empty_sections_stay_leaves():
  config = {"opt": {"lr": 1e-3, "schedule": {"warmup": 10}}, "grid": {}, "seed": 0}
  flat = trees.flatten(config, ".")
  assert flat == {"opt.lr": 1e-3, "opt.schedule.warmup": 10, "grid": {}, "seed": 0}
  assert trees.unflatten(flat, ".") == config  # the empty section comes back
  assert trees.flatten({"a": {"b": 1}}, prefix="params/") == {"params/a/b": 1}
  assert trees.flatten({}) == {} and trees.unflatten({}) == {}
