"""bert_jax.backends: what each backend runs for BertConfig's 'auto' choices, and the names
model.py keeps for them."""

import dataclasses

from bert_jax import backends, model_config
from bert_jax import model as model_lib

TINY = model_config.BertConfig(
  vocab_size=128,
  hidden_size=32,
  num_layers=2,
  num_heads=4,
  intermediate_size=64,
  max_position_embeddings=32,
)


def test_model_keeps_the_names():
  """`model.X` is the object backends.py / model_config.py define (configs, tools and users
  spell them model.X)."""
  for name in ("BertConfig", "REMAT_POLICIES", "SIZES", "size_fields", "config_for_size"):
    assert getattr(model_lib, name) is getattr(model_config, name), name
  for name in ("resolve_kernels", "resolved", "attention_choice", "ops_for", "XLA_OPS", "CPU_OPS"):
    assert getattr(model_lib, name) is getattr(backends, name), name
  for name in ("KEEP_MASKS", "DROPOUT_RNG_AUTO", "AUTO_ATTENTION", "platform_family", "Ops"):
    assert getattr(model_lib, name) is getattr(backends, name), name


def test_resolve_kernels_by_platform():
  """'auto' kernels: the CPU kernels on the CPU alone; explicit values stay; 'cuda' and
  'rocm' are the gpu family."""
  for platform, kernels, family in (
    ("cpu", "cpu", "cpu"),
    ("tpu", "xla", "tpu"),
    ("cuda", "xla", "gpu"),
    ("rocm", "xla", "gpu"),
  ):
    got = backends.resolve_kernels(TINY, platform)
    assert (got.kernels, got.platform) == (kernels, family)
    assert got.dropout_rng == backends.DROPOUT_RNG_AUTO[family]
    assert backends.resolved(got) is got
  pinned = dataclasses.replace(TINY, kernels="xla", dropout_rng="rbg")
  got = backends.resolve_kernels(pinned, "cpu")
  assert (got.kernels, got.dropout_rng) == ("xla", "rbg")
  assert backends.ops_for(got) is backends.XLA_OPS


def test_auto_attention_by_platform_and_length(monkeypatch):
  """'auto' without measurements is the behaviour before the switch (xla without attention
  dropout, explicit with it); measured entries apply to their platform, the nearest length."""
  gpu = backends.resolve_kernels(TINY, "gpu")
  cpu = backends.resolve_kernels(TINY, "cpu")
  monkeypatch.setattr(backends, "AUTO_ATTENTION", {})
  choice = backends.attention_choice
  assert [choice(gpu, 128, d, False) for d in (False, True)] == ["xla", "explicit"]
  assert choice(gpu, 128, False, True) == "explicit"  # probabilities asked for
  table = {("gpu", 128): ("cudnn", "explicit_lowp"), ("gpu", 512): ("xla", "explicit")}
  monkeypatch.setattr(backends, "AUTO_ATTENTION", table)
  assert [choice(gpu, s, False, False) for s in (64, 128, 300, 512, 2048)] == [
    "cudnn",
    "cudnn",
    "cudnn",
    "xla",
    "xla",
  ]
  assert choice(gpu, 128, True, False) == "explicit_lowp"
  assert choice(gpu, 128, True, True) == "explicit"
  assert [choice(cpu, 128, d, False) for d in (False, True)] == ["xla", "explicit"]
  # An explicit value is taken as it is.
  assert choice(dataclasses.replace(gpu, attention_impl="explicit_lowp"), 128, False, False) == (
    "explicit_lowp"
  )
