"""bert_jax.backends: what each backend runs for BertConfig's 'auto' choices, and the names
model.py keeps for them."""

import dataclasses

from bert_jax import backends, model_config
from bert_jax import model as model_lib
from unit._tiny_bert import TINY


def test_model_reexports_nothing():
  """Every class and function reachable as `model.X` is defined in model.py: a name of
  backends or model_config has one import path, its own module's."""
  import inspect

  foreign = [
    name
    for name, obj in vars(model_lib).items()
    if (inspect.isclass(obj) or inspect.isfunction(obj))
    and obj.__module__.startswith("bert_jax")
    and obj.__module__ != "bert_jax.model"
  ]
  assert foreign == []
  assert not hasattr(model_lib, "BertConfig") and not hasattr(model_lib, "resolve_kernels")


def test_resolve_kernels_by_platform():
  """'auto' kernels: the CPU kernels on the CPU, the fused LayerNorm kernels on a CUDA GPU
  (Triton), XLA's elsewhere (ROCm too); explicit values stay; 'cuda' and 'rocm' are the gpu
  family."""
  for platform, kernels, family in (
    ("cpu", "cpu", "cpu"),
    ("tpu", "xla", "tpu"),
    ("cuda", "fused", "gpu"),
    ("rocm", "xla", "gpu"),
  ):
    got = backends.resolve_kernels(TINY, platform)
    assert (got.kernels, got.platform) == (kernels, family)
    assert got.dropout_rng == backends.DROPOUT_RNG_AUTO[family]
    assert backends.resolved(got) is got
  pinned = dataclasses.replace(TINY, kernels="xla", dropout_rng="threefry")
  got = backends.resolve_kernels(pinned, "cpu")
  assert (got.kernels, got.dropout_rng) == ("xla", "threefry")
  assert backends.ops_for(got) is backends.XLA_OPS


class _Device:
  def __init__(self, kind, capability):
    self.device_kind, self.compute_capability = kind, capability


H200 = _Device("NVIDIA H200", "9.0")


def test_auto_attention_by_platform_and_length(monkeypatch):
  """'auto' without measurements is the behaviour before the switch (xla without attention
  dropout, explicit with it); measured entries apply to their platform, the nearest length."""
  monkeypatch.setattr(backends, "_local_gpu", lambda: H200)
  gpu = backends.resolve_kernels(dataclasses.replace(TINY, dtype="bfloat16"), "gpu")
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


BASE_BF16 = model_config.config_for_size("base", dtype="bfloat16")


def test_auto_on_a_gpu_is_hash_dropout_and_flash(monkeypatch):
  """On a GPU platform 'auto' is the hash dropout, the fused residual LayerNorm kernels and the
  flash kernels with attention dropout (every length), cuDNN's fused attention without it
  (xla where cuDNN cannot run: float32, or no CUDA GPU in the process); the old GPU default
  stays reachable as explicit values."""
  monkeypatch.setattr(backends, "_local_gpu", lambda: H200)
  for platform in ("gpu", "cuda"):
    cfg = backends.resolve_kernels(BASE_BF16, platform)
    assert (cfg.kernels, cfg.dropout_rng, cfg.platform) == ("fused", "hash", "gpu")
    for length in (128, 512):
      assert backends.attention_plan(cfg, length, True, False) == ("flash", "")
      assert backends.attention_plan(cfg, length, False, False) == ("cudnn", "")
  f32 = backends.resolve_kernels(dataclasses.replace(BASE_BF16, dtype="float32"), "gpu")
  assert backends.attention_choice(f32, 128, True, False) == "flash"
  assert backends.attention_plan(f32, 128, False, False) == (
    "xla",
    "cuDNN's fused attention has no float32 kernels",
  )
  old = dataclasses.replace(BASE_BF16, dropout_rng="threefry", attention_impl="explicit")
  old = backends.resolve_kernels(old, "gpu")
  assert (old.dropout_rng, old.kernels, backends.attention_choice(old, 128, True, False)) == (
    "threefry",
    "xla",  # the fused kernels draw the hash mask: threefry keeps XLA's LayerNorm
    "explicit",
  )
  monkeypatch.setattr(backends, "_local_gpu", lambda: None)  # lowering for a GPU elsewhere
  cfg = backends.resolve_kernels(BASE_BF16, "gpu")
  assert backends.attention_plan(cfg, 128, True, False) == ("flash", "")
  assert backends.attention_plan(cfg, 128, False, False) == (
    "xla",
    "cuDNN's fused attention is traced only in a process with a CUDA GPU",
  )
  # No other platform's 'auto' runs the flash kernels.
  for platform in ("cpu", "tpu"):
    cfg = backends.resolve_kernels(BASE_BF16, platform)
    assert backends.attention_choice(cfg, 128, True, False) != "flash"


def test_auto_falls_back_to_explicit_with_hash_where_flash_does_not_apply(monkeypatch):
  """Where the flash kernels do not apply (a head dim beyond FLASH_MAX_HEAD_DIM, a GPU without
  their Triton lowering, another dropout generator asked for) 'auto' runs the explicit
  attention, with the hash dropout of the GPU's 'auto'; the log line says why. A GPU without
  the Triton lowering runs XLA's LayerNorm too."""
  wide = backends.resolve_kernels(model_config.config_for_size("L6_H768_A3"), "gpu")
  assert wide.head_dim == 256 and wide.dropout_rng == "hash"
  impl, why = backends.attention_plan(wide, 128, True, False)
  assert (impl, why) == ("explicit", "flash is not run at head dim 256 > 128")
  line = backends.attention_line(wide, 128, True, False)
  assert line == (
    "attention: explicit (attention_impl=auto, gpu, key length 128, head dim 256, float32), "
    "hash dropout; flash is not run at head dim 256 > 128"
  )
  cfg = backends.resolve_kernels(BASE_BF16, "gpu")
  for device, fits in (
    (H200, True),
    (_Device("NVIDIA A100-SXM4-80GB", "8.0"), True),
    (_Device("Tesla V100-SXM2-16GB", "7.0"), False),
    (_Device("AMD Instinct MI250X", "gfx90a"), False),
  ):
    monkeypatch.setattr(backends, "_local_gpu", lambda device=device: device)
    impl, why = backends.attention_plan(cfg, 128, True, False)
    assert impl == ("flash" if fits else "explicit"), device.device_kind
    assert (why == "") == fits and (fits or device.device_kind in why)
    assert backends.resolve_kernels(BASE_BF16, "gpu").kernels == ("fused" if fits else "xla")
  monkeypatch.setattr(backends, "_local_gpu", lambda: None)
  threefry = backends.resolve_kernels(dataclasses.replace(BASE_BF16, dropout_rng="threefry"), "gpu")
  assert backends.attention_plan(threefry, 128, True, False) == (
    "explicit",
    "flash draws the hash mask, dropout_rng is threefry",
  )
  assert backends.attention_line(cfg, 128, True, False) == (
    "attention: flash (attention_impl=auto, gpu, key length 128, head dim 64, bfloat16), "
    "attention dropout from the hash mask"
  )


def test_the_model_logs_its_attention_once_and_falls_back_to_explicit_hash(caplog):
  """A GPU-resolved model whose head dim the flash kernels do not take traces the explicit
  attention with the hash masks (no Pallas kernel; murmur3's multiplier in the program), and
  says so in one log line per trace of the model, not one per layer."""
  import jax
  import jax.numpy as jnp

  cfg = dataclasses.replace(TINY, num_heads=1, hidden_size=256, intermediate_size=64)
  # XLA's LayerNorm: the GPU's fused kernels would not trace here (Triton, not interpreted).
  cfg = backends.resolve_kernels(dataclasses.replace(cfg, kernels="xla"), "gpu")
  model = model_lib.BertForPreTraining(cfg)
  ids = jnp.ones((2, 16), jnp.int32)
  params = model_lib.init_params(model, jax.random.key(0), 16)

  def apply(p):
    rngs = {"dropout": jax.random.key(1)}
    return model.apply({"params": p}, ids, deterministic=False, rngs=rngs)["mlm_logits"]

  caplog.set_level("INFO")
  caplog.clear()
  text = str(jax.make_jaxpr(apply)(params))
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention:")]
  assert lines == [
    "attention: explicit (attention_impl=auto, gpu, key length 16, head dim 256, float32), "
    "hash dropout; flash is not run at head dim 256 > 128"
  ]
  assert "pallas_call" not in text and str(0x85EBCA6B) in text


def test_one_table_of_peaks_for_the_trainers_and_the_benchmarks_mfu():
  """backends.peak_flops: the most specific device kind first; the benchmark reads the same."""
  from bert_jax.benchmark import gpu

  assert backends.peak_flops("NVIDIA H100 PCIe") == 756e12
  assert backends.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert backends.peak_flops("TPU v5 lite") == 197e12 and backends.peak_flops("TPU v5p") == 459e12
  assert backends.peak_flops("cpu") is None
  for kind, _ in backends.PEAK_BF16_FLOPS:
    assert gpu.datasheet_tflops(f"NVIDIA {kind}") * 1e12 == backends.peak_flops(kind)
