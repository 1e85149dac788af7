"""bert_jax.params_tree: the two layer layouts and their conversion, the tree check against a
config (one line naming the path), placement onto a sharded target."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from tiny_models import CFG, random_params

from bert_jax import params_tree
from bert_jax import sharding as sh
from bert_jax.trees import flatten


def test_stack_and_unstack_layers_round_trip_in_both_tree_kinds():
  for pretraining in (True, False):
    params = params_tree.unbox_to_numpy(random_params(CFG, pretraining))
    assert params_tree.is_pretraining(params) == pretraining
    assert not params_tree.is_scanned(params)
    stacked = params_tree.stack_layers(params)
    assert params_tree.is_scanned(stacked) and params_tree.stack_layers(stacked) is stacked
    prefix = "bert/encoder" if pretraining else "encoder"
    flat, flat_stacked = flatten(params), flatten(stacked)
    kernel = "query/kernel"
    # Layer i of the stack is layer_i, exactly.
    for i in range(CFG.num_layers):
      np.testing.assert_array_equal(
        flat_stacked[f"{prefix}/layers/layer/{kernel}"][i], flat[f"{prefix}/layer_{i}/{kernel}"]
      )
    assert flat_stacked[f"{prefix}/layers/layer/{kernel}"].shape == (
      2,
      12,
      3,
      4,
    )  # layers, d, heads, head_dim
    # Everything outside the encoder is the same object.
    outside = [k for k in flat if "/encoder/" not in f"/{k}"]
    assert outside and all(flat_stacked[k] is flat[k] for k in outside)
    back = params_tree.unstack_layers(stacked)
    assert flatten(back).keys() == flat.keys()
    assert all(np.array_equal(flatten(back)[k], flat[k]) for k in flat)
    assert params_tree.to_layout(params, True).keys() == stacked.keys()
    assert params_tree.to_layout(stacked, False).keys() == params.keys()


def test_layouts_refuse_what_is_not_a_bert_tree():
  with pytest.raises(ValueError, match=r"^params have neither 'bert' nor 'encoder' at the top: "
                     r"\['head', 'x'\]$"):  # fmt: skip
    params_tree.is_scanned({"x": 1, "head": 2})
  params = params_tree.unbox_to_numpy(random_params(CFG, False))
  params["encoder"]["layer_5"] = params["encoder"]["layer_1"]
  with pytest.raises(ValueError, match=r"encoder has unexpected children \['layer_0', 'layer_1', "):
    params_tree.stack_layers(params)


def test_check_tree_names_the_first_wrong_path():
  params = params_tree.unbox_to_numpy(random_params(CFG, True))
  params_tree.check_tree(params, CFG, True, "ckpt")
  expected = params_tree.expected_shapes(CFG, True)
  assert params_tree.shapes(params) == expected
  assert expected["bert/embeddings/word_embeddings/embedding"] == (40, 12)
  bigger = dataclasses.replace(CFG, intermediate_size=24)
  want = (
    r"^ckpt: parameter 'bert/encoder/layer_0/intermediate/bias' has shape \(20,\), but the "
    r"config implies \(24,\)$"
  )
  with pytest.raises(ValueError, match=want):
    params_tree.check_tree(params, bigger, True, "ckpt")
  no_mlm = {k: v for k, v in params.items() if k != "predictions"}
  with pytest.raises(ValueError, match=r"^ckpt: missing parameter 'predictions/"):
    params_tree.check_tree(no_mlm, CFG, True, "ckpt")
  bert_model = {**params["bert"], "predictions": params["predictions"]}
  with pytest.raises(ValueError, match=r"^m: unexpected parameter 'predictions/"):
    params_tree.check_tree(bert_model, CFG, False, "m")
  assert params_tree.has_head({"bert": {}, "head": {}}) and not params_tree.has_head(params)


def test_place_puts_host_arrays_onto_the_targets_dtype_and_sharding():
  mesh = sh.make_mesh((2, 2, 2))
  sharding = NamedSharding(mesh, PartitionSpec("data"))
  target = {"w": jax.ShapeDtypeStruct((4, 3), np.float32, sharding=sharding)}
  host = {"w": np.arange(12, dtype=np.float64).reshape(4, 3)}
  placed = params_tree.place(host, target)
  assert placed["w"].dtype == np.float32 and placed["w"].sharding == sharding
  np.testing.assert_array_equal(np.asarray(placed["w"]), host["w"])
  with pytest.raises(ValueError, match=r"^parameter has shape \(3, 4\), the target \(4, 3\)$"):
    params_tree.place({"w": host["w"].T}, target)
