"""bert_jax.model_config: the named sizes (and any L<n>_H<d>_A<h>), the checks a BertConfig makes
when built, its derived values, and the values of earlier versions read as today's."""

import jax.numpy as jnp
import pytest

from bert_jax import model_config
from bert_jax.model_config import BertConfig


def test_named_sizes_and_the_papers_names():
  assert model_config.size_fields("base") == dict(
    num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072
  )
  assert model_config.size_fields("tiny") == dict(
    num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512
  )
  # Any size named as the paper names them, not only Table 6's rows.
  assert model_config.size_fields("L4_H256_A4") == dict(
    num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024
  )
  for bad in ("huge", "L4_H250_A4", "L0_H256_A4", "L4_H256"):
    with pytest.raises(ValueError, match=rf"^unknown model size '{bad}'; choose from tiny, mini,"):
      model_config.size_fields(bad)
  cfg = model_config.config_for_size("large", vocab_size=100, causal=True)
  assert (cfg.num_layers, cfg.hidden_size, cfg.head_dim) == (24, 1024, 64)
  assert cfg.vocab_size == 100 and cfg.causal and cfg.intermediate_size == 4096


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"hidden_size": 100, "num_heads": 12}, "hidden_size 100 is not divisible by num_heads 12"),
    ({"kernels": "gpu"}, "kernels must be one of auto, xla, cpu, fused, not 'gpu'"),
    ({"dropout_rng": "rbg"}, "dropout_rng must be one of auto, threefry, hash, not 'rbg'"),
    ({"attention_impl": "fast"}, "attention_impl must be one of auto, explicit, "),
    ({"attention_impl": "xla"}, "attention_impl='xla' has no attention dropout: set "
     "attention_dropout_prob=0 (it is 0.1)"),
    ({"remat_policy": "some"}, "remat_policy 'some' not in ['dots', 'dots_no_batch', 'full', "
     "'gelu', 'minimal', 'none']"),
    ({"dtype": "int8"}, "dtype must be float32, bfloat16 or float16, not 'int8'"),
    ({"param_dtype": "float64"}, "param_dtype must be float32, bfloat16 or float16, not "
     "'float64'"),
  ],
)  # fmt: skip
def test_a_bad_field_is_refused_when_built(fields, message):
  with pytest.raises(ValueError) as e:
    BertConfig(**fields)
  assert str(e.value).startswith(message), str(e.value)


def test_derived_values():
  cfg = BertConfig(dtype="bfloat16")
  assert cfg.head_dim == 64
  assert cfg.compute_dtype == jnp.bfloat16 and cfg.storage_dtype == jnp.float32
  assert BertConfig(attention_impl="xla", attention_dropout_prob=0.0).attention_impl == "xla"
  # The last layer prunes unrolled, or scanned only with the last layer unrolled.
  assert cfg.last_layer_prunable
  assert not BertConfig(prune_last_layer=False).last_layer_prunable
  assert not BertConfig(scan_layers=True).last_layer_prunable
  assert BertConfig(scan_layers=True, unroll_last_layer=True).last_layer_prunable


def test_retired_values_read_as_todays():
  stored = {"kernels": "lowp", "dropout_rng": "hash_redraw", "attention_impl": "fused",
            "hidden_size": 32, "dtype": "float32"}  # fmt: skip
  assert model_config.retired_to_current(stored) == {
    "kernels": "xla",
    "dropout_rng": "hash",
    "attention_impl": "auto",
    "hidden_size": 32,
    "dtype": "float32",
  }
  assert model_config.retired_to_current({"dropout_rng": "rbg"}) == {"dropout_rng": "auto"}
  assert model_config.retired_to_current({"kernels": "cpu"}) == {"kernels": "cpu"}
