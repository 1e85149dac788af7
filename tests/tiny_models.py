"""A tiny BERT config and random params of it, for the unit tests of checkpoints' formats
(interop) and of bert_jax.load: no training, no compile."""

import jax
import numpy as np

from bert_jax import model as model_lib
from bert_jax.model_config import BertConfig

CFG = BertConfig(
  vocab_size=40, hidden_size=12, num_layers=2, num_heads=3, intermediate_size=20,
  max_position_embeddings=16,
)  # fmt: skip


def random_params(cfg: BertConfig = CFG, pretraining: bool = True, seed: int = 0):
  """Standard-normal float32 params of `cfg` (a BertForPreTraining or BertModel tree)."""
  rng = np.random.default_rng(seed)
  abstract = model_lib.abstract_params(cfg, pretraining)
  return jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), abstract)
