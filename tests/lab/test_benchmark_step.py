"""bert_jax.benchmark.step: our step is the trainer's jitted step, the kernel variants are model
fields."""

import math

import pytest

from bert_jax import backends, train
from bert_jax.benchmark import step


@pytest.mark.slow
def test_build_step_is_the_trainers_jitted_step(monkeypatch):
  calls = []

  def spy(name):
    fn = getattr(train, name)

    def called(*args, **kwargs):
      calls.append(name)
      return fn(*args, **kwargs)

    monkeypatch.setattr(train, name, called)

  spy("abstract_state")
  spy("jit_train_step")
  spy("state_init_fn")
  spy("create_state")
  config = step.bench_config("tiny", 32, 2, "float32", {"hidden_dropout_prob": 0.0})
  s = step.build_step(config)
  # Lowered against the abstract state (which traces state_init_fn abstractly); the state made
  # by create_state's own init (state_init_fn under sharding.sharded_init), compiled with the
  # step and run after it; create_state itself (init compiled and run first) never.
  assert calls == ["abstract_state", "state_init_fn", "jit_train_step", "state_init_fn"]
  assert s.init is not None and s.init_compile_s > 0
  # The trainer's model config, its kernels resolved for this (CPU) backend as train does.
  assert s.cfg == backends.resolve_kernels(train.bert_config(config), "cpu")
  assert s.cfg.kernels == "cpu" and s.cfg.hidden_dropout_prob == 0.0
  _, losses = step.run_steps(s, 2)
  # A fresh model: MLM over the vocab + NSP, ~ ln(V) + ln(2); one AdamW step lowers it.
  assert abs(losses[0] - (math.log(s.cfg.vocab_size) + math.log(2))) < 0.5
  assert losses[1] < losses[0]
  with pytest.raises(ValueError, match="'nope' is not a BertConfig field"):
    step.bench_config("tiny", 32, 2, "float32", {"nope": 1})


def test_kernel_variants_are_model_fields():
  assert step.bench_config("tiny", 32, 2, "float32", {}).model.kernels == "auto"
  for variant, kernels in ((step.FAST, "cpu"), (step.PLAIN, "xla")):
    config = step.bench_config("tiny", 32, 2, "float32", variant)
    assert config.model.kernels == kernels
    # An explicit setting is what runs, on any backend.
    assert backends.resolve_kernels(train.bert_config(config), "tpu").kernels == kernels
