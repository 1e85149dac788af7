"""bert_jax.interop.hf_names: our params and config <-> HuggingFace's names and shapes, and
Google's TF variable names -> HF's (the parity with transformers' own outputs:
test_convert.py)."""

import dataclasses

import numpy as np
import pytest
from tiny_models import CFG, random_params

from bert_jax.interop import hf_names
from bert_jax.trees import flatten


def test_config_round_trips_through_hf_config_json():
  hf = hf_names.config_to_hf(CFG)
  assert hf["architectures"] == ["BertForPreTraining"] and hf["num_hidden_layers"] == 2
  assert hf["hidden_size"] == 12 and hf["num_attention_heads"] == 3
  back = hf_names.config_from_hf(hf)
  for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
    assert getattr(back, f) == getattr(CFG, f), f
  assert hf_names.config_to_hf(CFG, pretraining=False)["architectures"] == ["BertModel"]


@pytest.mark.parametrize(
  "hf,needle",
  [
    ({"model_type": "roberta", "vocab_size": 4}, "model_type 'roberta' is not 'bert'"),
    ({"vocab_size": 4, "hidden_size": 8, "num_hidden_layers": 1}, "missing key"),
  ],
)
def test_config_from_hf_refuses_in_one_line_naming_the_file(hf, needle):
  with pytest.raises(ValueError, match=f"^x/config.json: .*{needle}") as e:
    hf_names.config_from_hf(hf, "x/config.json")
  assert "\n" not in str(e.value)


def test_state_dict_round_trip_reshapes_attention_and_transposes_linears():
  params = random_params(CFG)
  sd = hf_names.params_to_hf_state_dict(params, CFG)
  flat = flatten(params)
  q = flat["bert/encoder/layer_0/query/kernel"]  # ours (D, H, K)
  assert q.shape == (12, 3, 4)
  # HF Linear weights are (out, in): (H*K, D)
  np.testing.assert_array_equal(
    sd["bert.encoder.layer.0.attention.self.query.weight"], q.reshape(12, 12).T
  )
  pooler = flat["bert/pooler/kernel"]
  np.testing.assert_array_equal(sd["bert.pooler.dense.weight"], pooler.T)
  # The tied decoder is left out, as save_pretrained leaves it.
  assert "cls.predictions.decoder.weight" not in sd and "cls.predictions.bias" in sd
  back = hf_names.hf_state_dict_to_params(sd, CFG)
  got = flatten(back)
  assert set(got) == set(flat)
  for k, v in flat.items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_state_dict_without_prefix_and_with_old_layernorm_names_reads_the_same():
  cfg = dataclasses.replace(CFG, num_layers=1)
  params = random_params(cfg, pretraining=False, seed=1)
  sd = hf_names.params_to_hf_state_dict(params, cfg)  # a BertModel's: no "bert." prefix
  assert not any(k.startswith("bert.") for k in sd)
  rename = lambda k: k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
    "LayerNorm.bias", "LayerNorm.beta"
  )
  old = {rename(k): v for k, v in sd.items()}
  assert any(k.endswith("LayerNorm.gamma") for k in old)
  got = flatten(hf_names.hf_state_dict_to_params(old, cfg, pretraining=False))
  for k, v in flatten(params).items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_a_missing_tensor_is_named():
  sd = hf_names.params_to_hf_state_dict(random_params(CFG), CFG)
  del sd["bert.encoder.layer.1.output.dense.weight"]
  with pytest.raises(ValueError, match="encoder.layer.1.output.dense.weight") as e:
    hf_names.hf_state_dict_to_params(sd, CFG, source="m.safetensors")
  assert str(e.value).startswith("m.safetensors") and "\n" not in str(e.value)


def test_tf_variables_map_to_hf_names_with_kernels_transposed_and_slots_dropped():
  kernel = np.arange(6, dtype=np.float32).reshape(2, 3)  # TF dense kernels are (in, out)
  variables = {
    "bert/encoder/layer_0/attention/self/query/kernel": kernel,
    "bert/encoder/layer_0/attention/self/query/kernel/adam_m": kernel,
    "bert/embeddings/word_embeddings": np.ones((5, 2), np.float32),
    "bert/embeddings/LayerNorm/gamma": np.ones(2, np.float32),
    "bert/embeddings/LayerNorm/beta": np.zeros(2, np.float32),
    "cls/seq_relationship/output_weights": np.ones((2, 2), np.float32),
    "cls/seq_relationship/output_bias": np.zeros(2, np.float32),
    "global_step": np.array(7),
  }
  sd = hf_names.tf_variables_to_hf_state_dict(variables)
  assert set(sd) == {
    "bert.encoder.layer.0.attention.self.query.weight",
    "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.LayerNorm.weight",
    "bert.embeddings.LayerNorm.bias",
    "cls.seq_relationship.weight",
    "cls.seq_relationship.bias",
  }
  np.testing.assert_array_equal(sd["bert.encoder.layer.0.attention.self.query.weight"], kernel.T)
