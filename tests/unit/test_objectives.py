"""bert_jax.objectives: the token cross-entropy and the accuracy the train step sums."""

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import objectives

OBJ = objectives.Objective()


def _outputs_inputs(seed: int = 0, b: int = 4, p: int = 6, v: int = 50):
  rng = np.random.default_rng(seed)
  outputs = {
    "mlm_logits": jnp.asarray(3 * rng.normal(size=(b, p, v)), jnp.float32),
    "nsp_logits": jnp.asarray(rng.normal(size=(b, 2)), jnp.float32),
  }
  inputs = {
    "targets": jnp.asarray(rng.integers(0, v, (b, p)), jnp.int32),
    "target_weights": jnp.asarray(rng.random((b, p)) < 0.8, jnp.float32),
    "next_sentence_label": jnp.asarray(rng.integers(0, 2, b), jnp.int32),
    "example_weight": jnp.ones(b, jnp.float32),
  }
  return outputs, inputs


def _reference(logits, targets, weights):
  """The loss and accuracy as written before: jax.nn.logsumexp and an argmax."""
  nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
  correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return jnp.sum(nll * weights), jnp.sum(correct * weights)


def test_token_loss_and_accuracy_equal_logsumexp_and_argmax():
  """MLM and NSP sums: the loss of jax.nn.logsumexp (and its gradient), the accuracy of an
  argmax, on logits without ties; with the target made the row's max in some rows, those
  count as right."""
  outputs, inputs = _outputs_inputs()
  logits, targets = outputs["mlm_logits"], inputs["targets"]
  best = jnp.argmax(logits, -1)
  targets = jnp.where(jnp.arange(6) % 2 == 0, best, targets)  # every other position right
  inputs["targets"] = targets
  sums = objectives.losses(outputs, inputs, OBJ)
  loss, correct = _reference(logits, targets, inputs["target_weights"])
  np.testing.assert_array_equal(sums["mlm_loss"], loss)
  assert float(sums["mlm_correct"]) == float(correct)
  assert 0 < float(correct) < float(sums["mlm_count"])
  nsp_loss, nsp_correct = _reference(
    outputs["nsp_logits"][:, None], inputs["next_sentence_label"][:, None], jnp.ones((4, 1))
  )
  np.testing.assert_allclose(sums["nsp_loss"], nsp_loss, rtol=1e-6)
  assert float(sums["nsp_correct"]) == float(nsp_correct)

  w = inputs["target_weights"]
  mlm_loss = lambda x: objectives.losses({**outputs, "mlm_logits": x}, inputs, OBJ)["mlm_loss"]
  ours, ref = jax.grad(mlm_loss), jax.grad(lambda x: _reference(x, targets, w)[0])
  np.testing.assert_array_equal(ours(logits), ref(logits))


def test_accuracy_needs_no_argmax_and_counts_ties_right():
  """The step's losses trace to no argmax (the accuracy reuses logsumexp's row max); a target
  tied with the row max counts as right."""
  outputs, inputs = _outputs_inputs()
  text = str(jax.make_jaxpr(lambda o: objectives.losses(o, inputs, OBJ))(outputs))
  assert "argmax" not in text
  tied = {**outputs, "mlm_logits": jnp.zeros((4, 6, 50))}  # every logit the max
  sums = objectives.losses(tied, inputs, OBJ)
  assert float(sums["mlm_correct"]) == float(sums["mlm_count"])


def test_the_lm_objective_names_its_metrics():
  """One name for the token objective, everywhere its metrics are keyed (`lm_name`)."""
  assert objectives.lm_name(False) == "mlm" and objectives.lm_name(True) == "ltr"
  outputs, inputs = _outputs_inputs()
  ltr = objectives.Objective(mlm=False, ltr=True, nsp=False)
  assert set(objectives.losses(outputs, inputs, ltr)) == {"ltr_loss", "ltr_correct", "ltr_count"}
  assert set(objectives.counts(inputs, ltr)) == {"ltr_count"}
  assert "mlm_loss" in objectives.losses(outputs, inputs, OBJ)
