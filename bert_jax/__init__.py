"""bert_jax: faithful, fast BERT pretraining and ablations in JAX/Flax (linen)."""

__version__ = "0.1.0"


def load(path, **kwargs):
  """Loads a workdir or checkpoint for a notebook: see `bert_jax.api.load`."""
  from bert_jax import api

  return api.load(path, **kwargs)
