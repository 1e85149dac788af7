"""The trainer's train step as a program, without the device it is for: what a model variant
changes in it. Per variant, one line of numbers:

  python tools/probes/step_program.py --size=base --seq=128 --batch=256 --target=cuda \
      --variants='dropout_rng=threefry;dropout_rng=hash'

--target=cuda lowers the step for a GPU (no GPU, no CUDA plugin needed: StableHLO as JAX emits
it for 'cuda', before XLA's GPU passes, every call inlined) and counts its ops: all of them, the
integer ops that make random bits (xor, shifts, integer multiplies and adds on ui32), loops.
--target=v5p-8 (any `bert_jax.aot` topology; needs libtpu) or cpu compiles it for ONE chip of
it, as one GPU runs it (the trainer's jitted step, state donated; a v5p chip has 95 GiB, room
for a GPU's batch): lower and compile time, XLA's temporaries and arguments, FLOPs and the bytes
its cost analysis says the step reads and writes. The model takes the 'auto' choices of
--resolve (default gpu). A variant is ','-separated BertConfig fields (`field=value`), e.g.
`scan_layers=True,remat_policy=dots`; '' is the config as it is. --part=update compiles the
optimizer update alone (`optim.apply_update` on float32 gradients of the model's parameters).
--part=add_norm compiles one post-LN sublayer's unfused dropout + residual + LayerNorm
(the 'hash' mask, XLA's LayerNorm; forward and backward) on the CPU at the step's [B * L, D]:
XLA:CPU's fusions and the bytes its cost analysis counts (kernels='fused' runs it as two
Pallas kernels; XLA:CPU fuses differently from XLA:GPU, so an indication only).
"""

from __future__ import annotations

import collections
import functools
import re
import time

from absl import flags

from bert_jax import cli, config_lib
from bert_jax.benchmark import suite

flags.DEFINE_string("size", "base", "Model size.")
flags.DEFINE_integer("seq", 128, "Sequence length.")
flags.DEFINE_integer("batch", 256, "Global batch.")
flags.DEFINE_string("dtype", "bfloat16", "Compute dtype.")
flags.DEFINE_string("target", "cuda", "cuda (lowered only), cpu, or an aot topology (v5e-16).")
flags.DEFINE_string("resolve", "gpu", "The platform whose 'auto' choices the model takes.")
flags.DEFINE_string("variants", "", "';'-separated variants of ','-separated field=value.")
flags.DEFINE_integer("num_layers", 0, "num_layers override (0: the size's own).")
flags.DEFINE_enum(
  "part", "step", ["step", "update", "add_norm"], "The train step, its update, or one sublayer."
)
FLAGS = flags.FLAGS

# StableHLO ops of random bits: threefry's rounds and the hash are xor / shift / add / multiply
# on ui32.
_RNG_OPS = ("xor", "shift_right_logical", "shift_left", "or", "add", "multiply")


def make_config(size: str, seq: int, batch: int, dtype: str, fields: dict):
  """The trainer's config for `size` at seq x batch, masking 15% of positions (20 of 128, as
  the GPU benchmark), with `fields` set on config.model."""
  c = config_lib.base_config(size)
  c.data.max_seq_length, c.data.batch_size = seq, batch
  c.masking.max_predictions = max(1, round(0.15 * seq + 0.8))
  c.model.dtype = dtype
  for k, v in fields.items():
    setattr(c.model, k, v)
  return c


def parse_variant(text: str) -> dict:
  out = {}
  for item in filter(None, text.split(",")):
    key, _, value = item.partition("=")
    out[key.strip()] = suite.parse_value(value.strip())
  return out


def _traced_step(config, platform: str, devices):
  """The trainer's jitted train step traced on one device of `devices` for a batch of
  `config`, the model resolved for `platform` ('gpu': kernels, dropout and attention as a GPU
  resolves 'auto')."""
  import jax
  import jax.numpy as jnp

  from bert_jax import aot, train
  from bert_jax import sharding as sh

  mesh = sh.make_mesh((1, 1, 1), devices[:1])
  rules = sh.rules_from_config(config.mesh.rules)
  _, model, tx, obj = train.model_and_optimizer(config, platform)
  state_sh, state = train.abstract_state(config, model, tx, mesh, rules, jax.random.key(0))
  b, length = config.data.batch_size, config.data.max_seq_length
  names = ("input_ids", "segment_ids", "input_mask")
  batch = {k: jax.ShapeDtypeStruct((b, length), jnp.int32) for k in names}
  for k in ("next_sentence_label", "example_id", "epoch"):
    batch[k] = jax.ShapeDtypeStruct((b,), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  with sh.mesh_context(mesh, rules):
    step = train.jit_train_step(
      model, tx, obj, aot._masking_tables(config), config.opt.grad_accum_steps, mesh, state_sh
    )
    return step.trace(state, batch, key)


def lowered_for_cuda(config) -> str:
  """StableHLO of the train step as JAX lowers it for a GPU (kernels resolved for 'gpu')."""
  import jax

  traced = _traced_step(config, "gpu", jax.devices())
  return traced.lower(lowering_platforms=("cuda",)).as_text()


def _traced_update(config, platform: str, devices):
  """`optim.apply_update` alone (the config's optimizer, float32 gradients of the model's
  parameters) on one device of `devices`, the state donated as the train step donates it."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from bert_jax import model as model_lib
  from bert_jax import optim, train

  _, model, tx, _ = train.model_and_optimizer(config, platform)
  one = NamedSharding(Mesh(np.array(devices[:1]), ("x",)), PartitionSpec())
  params = model_lib.abstract_params(model.cfg)
  state = {"step": jnp.int32(0), "params": params, "opt_state": jax.eval_shape(tx.init, params)}
  state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), state)
  grads = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32, sharding=one), params)
  update = jax.jit(lambda s, g: optim.apply_update(s, g, tx), donate_argnums=0)
  return update.trace(state, grads)


def compiled_on_one_chip(config, target: str) -> dict:
  """The train step resolved as on a GPU, compiled for one chip of `target` (an aot
  topology: v5p-8's chips have 95 GiB, room for a GPU's batch) or the CPU."""
  import jax

  from bert_jax import aot

  devices = jax.devices() if target == "cpu" else aot.topology_devices(target)[0]
  t0 = time.perf_counter()
  trace = _traced_step if FLAGS.part == "step" else _traced_update
  lowered = trace(config, FLAGS.resolve, devices).lower()
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  mem, cost = compiled.memory_analysis(), compiled.cost_analysis() or {}
  return {
    "lower_s": round(t1 - t0, 1),
    "compile_s": round(t2 - t1, 1),
    "temp_GiB": round(mem.temp_size_in_bytes / 2**30, 2),
    "args_GiB": round(mem.argument_size_in_bytes / 2**30, 2),
    "xla_flops": f"{float(cost.get('flops', -1)):.3e}",
    "xla_bytes": f"{float(cost.get('bytes accessed', -1)):.3e}",
  }


def add_norm_on_cpu(config) -> dict:
  """One sublayer's unfused `LayerNorm(x + dropout(h))` with its VJP, compiled by XLA:CPU at
  the config's [batch * seq, hidden] in its dtype: fusions and other ops of the entry
  computation, and cost analysis bytes."""
  import jax
  import jax.numpy as jnp

  from bert_jax import backends
  from bert_jax.backends import dropout

  m = config.model
  rows, hidden, dtype = config.data.batch_size * config.data.max_seq_length, m.hidden_size, m.dtype
  rate = m.hidden_dropout_prob

  def sublayer(x, h, scale, bias, key):
    z = dropout.dropout(h, dropout.keep_mask(key, h.shape, rate), rate) + x
    norm = backends.XLA_OPS.layer_norm(epsilon=m.layer_norm_eps, dtype=dtype)
    return norm.apply({"params": {"scale": scale, "bias": bias}}, z)

  def step(x, h, scale, bias, key, g):
    y, vjp = jax.vjp(lambda *a: sublayer(*a, key), x, h, scale, bias)
    return y, vjp(g)

  act = jax.ShapeDtypeStruct((rows, hidden), jnp.dtype(dtype))
  vec = jax.ShapeDtypeStruct((hidden,), jnp.float32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  compiled = jax.jit(step).trace(act, act, vec, vec, key, act).lower().compile()
  entry = compiled.as_text().split("\nENTRY ", 1)[1]
  return {
    "fusions": len(re.findall(r"= \S+ fusion\(", entry)),
    "entry_ops": len(re.findall(r"^\s+\S+ = ", entry, re.M)),
    "xla_bytes": f"{float(compiled.cost_analysis()['bytes accessed']):.3e}",
    "tensor_bytes": f"{rows * hidden * jnp.dtype(dtype).itemsize:.3e}",
  }


def _functions(text: str) -> dict[str, str]:
  """{name: body} of the module's functions (JAX outlines jitted helpers: where, threefry, ...)."""
  parts = re.split(r"\n  func\.func (?:private|public) @(\w+)", text)
  return dict(zip(parts[1::2], parts[2::2], strict=True))


def op_counts(text: str) -> dict:
  """Ops of the module as XLA sees it once every call is inlined: in all, and those on ui32
  (random bits), loops, custom calls (Triton's: the Pallas kernels), and the reductions,
  compares and selects (LayerNorm's statistics and gradients, dropout's masks)."""
  funcs = _functions(text)
  own = {}
  for name, body in funcs.items():
    ops = collections.Counter(re.findall(r"= (?:stablehlo|chlo|mhlo)\.(\w+)", body))
    ops["ui32"] = sum(
      len(re.findall(rf"stablehlo\.{op} [^\n]*tensor<[^>]*ui32>\n", body)) for op in _RNG_OPS
    )
    ops["triton"] = body.count("__gpu$xla.gpu.triton")
    own[name] = (ops, collections.Counter(re.findall(r"(?<!\w)call @(\w+)", body)))

  @functools.cache
  def inlined(name: str) -> collections.Counter:
    ops, calls = own[name]
    total = collections.Counter(ops)
    for callee, n in calls.items():
      for k, v in inlined(callee).items():
        total[k] += n * v
    return total

  ops = inlined("main")
  return {
    "ops": sum(v for k, v in ops.items() if k not in ("ui32", "triton")),
    "ui32_ops": ops["ui32"],
    "while": ops["while"],
    "rng_bit_generator": ops["rng_bit_generator"],
    "custom_call": ops["custom_call"],
    "triton": ops["triton"],  # Pallas kernels
    "reduce": ops["reduce"],
    "compare": ops["compare"],
    "select": ops["select"],
    "chars": len(text),
  }


def main(argv: list[str]) -> None:
  del argv
  for text in FLAGS.variants.split(";"):
    fields = parse_variant(text)
    if FLAGS.num_layers:
      fields.setdefault("num_layers", FLAGS.num_layers)
    config = make_config(FLAGS.size, FLAGS.seq, FLAGS.batch, FLAGS.dtype, fields)
    t0 = time.perf_counter()
    if FLAGS.part == "add_norm":
      got = add_norm_on_cpu(config)
    elif FLAGS.target == "cuda":
      got = op_counts(lowered_for_cuda(config))
      got["lower_s"] = round(time.perf_counter() - t0, 1)
    else:
      got = compiled_on_one_chip(config, FLAGS.target)
    target = "cpu" if FLAGS.part == "add_norm" else FLAGS.target
    print(f"{FLAGS.size} {FLAGS.seq}x{FLAGS.batch} {target} [{text}]: {got}", flush=True)


def run() -> None:
  cli.run(main, "step_program")


if __name__ == "__main__":
  run()
