"""bert_jax.tasks.heads: the pooled heads run the pruned last layer at the pooled token only and
give the full model's logits."""

import numpy as np
import pytest

from bert_jax import model_config


@pytest.mark.parametrize(
  "kind,causal", [("classification", False), ("classification", True), ("multiple_choice", False)]
)
def test_pooled_heads_run_the_last_layer_at_the_pooled_token_only(kind, causal):
  """The pruned last layer (queries at the pooled token only) gives the full model's logits."""
  import dataclasses

  import jax
  import jax.numpy as jnp

  from bert_jax.tasks import Task

  cfg = model_config.config_for_size(
    "tiny", vocab_size=64, max_position_embeddings=16, causal=causal
  )
  task = Task("t", kind, ("a", "b", "c") if kind == "classification" else (), ("accuracy",))
  pruned, full = task.model(cfg), task.model(dataclasses.replace(cfg, prune_last_layer=False))
  shape = (3, 2, 12) if kind == "multiple_choice" else (3, 12)
  ids = jax.random.randint(jax.random.key(1), shape, 1, 64)
  lengths = jnp.array([12, 7, 3]).reshape(3, *([1] * (len(shape) - 1)))
  mask = jnp.broadcast_to(jnp.arange(12) < lengths, shape).astype(jnp.int32)
  params = full.init({"params": jax.random.key(0)}, ids, 0 * ids, mask)["params"]
  a = pruned.apply({"params": params}, ids, 0 * ids, mask)
  b = full.apply({"params": params}, ids, 0 * ids, mask)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
