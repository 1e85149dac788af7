"""bert_jax: faithful, fast BERT pretraining and ablations in JAX/Flax (linen)."""

__version__ = "0.1.0"


def load(path: str, step: int | None = None, device=None, dtype: str | None = None):
  """A checkpoint for the notebook (fill_mask, embed) onto one device: a training workdir (its
  latest step, or `step`), one orbax step, a HuggingFace dir, a Google TF checkpoint or a params
  dir. `device`: a jax.Device (default: the first); `dtype`: the compute dtype ('float32',
  'bfloat16', 'float16'; None: the checkpoint's own). See `bert_jax.api.load` (imported here
  only when called, so `import bert_jax` stays light)."""
  from bert_jax import api

  return api.load(path, step, device=device, dtype=dtype)
