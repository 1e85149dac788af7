"""bert_jax.benchmark.sizes: the MiniLM size and the fine-tuning FLOPs by hand."""

import pytest

from bert_jax import model_config
from bert_jax.benchmark import (
  sizes,
  step,
)


def test_minilm_size_and_finetune_flops():
  cfg = sizes.config_for_size("minilm")
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (6, 384, 12)
  assert (cfg.intermediate_size, cfg.vocab_size) == (1536, 30522)  # all-MiniLM-L6-v2's shape
  assert sizes.config_for_size("base") == model_config.config_for_size("base")
  with pytest.raises(ValueError, match=r"^--sizes: unknown size 'huge'; choose from tiny, "):
    sizes.size_fields("huge")
  assert step.bench_config("minilm", 128, 2, "float32", {}).model.hidden_size == 384
  # tiny (2 layers, d 128, f 512) at seq 32, by hand: a layer 6 (4 d^2 + 2 d f) + 12 d L
  # = 6 (65,536 + 131,072) + 49,152 = 1,228,800; pooler + 2-way classifier once per sequence
  # 6 (d^2 + 2 d) / L = 3,120; no MLM head.
  tiny = sizes.config_for_size("tiny")
  assert sizes.finetune_flops_per_token(tiny, 32) == 2 * 1_228_800 + 3_120
  assert sizes.finetune_flops_per_token(tiny, 32, 3) == 2 * 1_228_800 + 3_120 + 6 * 128 / 32
