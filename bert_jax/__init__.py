"""bert_jax: faithful, fast BERT pretraining and ablations in JAX/Flax (linen)."""

__version__ = "0.1.0"


def load(path, step=None, **kwargs):
  """A checkpoint for the notebook (fill_mask, embed): a training workdir (latest step, or
  `step`), one orbax step, a HuggingFace dir, a Google TF checkpoint or a params dir. See
  `bert_jax.api.load`."""
  from bert_jax import api

  return api.load(path, step, **kwargs)
