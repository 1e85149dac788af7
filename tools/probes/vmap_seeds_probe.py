"""Several fine-tuning seeds in one program: one `jax.vmap`ped train step of S seeds against S
single steps, on the benchmark's sequence-classification step (`benchmark.finetune_step`'s
config, model and batch), the two taking turns so that host drift hits both alike.

The engine runs seeds one after another. This probe is the measurement that decides whether a
vmapped multi-seed step would pay on a backend: run it there first.

  python tools/probes/vmap_seeds_probe.py --size=tiny --seeds=4 --batch=8 --dtype=float32

Prints one JSON line: the median time of S single steps, of one vmapped step, and their ratio
(above 1: the vmapped step is faster).
"""

import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import app, flags

from bert_jax import sharding as sh
from bert_jax.benchmark import finetune_step

_SIZE = flags.DEFINE_string("size", "tiny", "A benchmark size (benchmark/sizes.py).")
_SEEDS = flags.DEFINE_integer("seeds", 4, "Seeds in the vmapped step.")
_BATCH = flags.DEFINE_integer("batch", 8, "Examples per seed and step.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Compute dtype.")
_ROUNDS = flags.DEFINE_integer("rounds", 6, "Timed rounds (each times both, alternating order).")


def build(config, seeds: int):
  """(single, multi, states, state_s, batch, batch_s, rngs) for a `finetune_step.bench_config`:
  the engine's jitted step and its vmap over seeds, each seed's state alone and all stacked
  (the same inits), the benchmark batch alone and stacked, and each seed's step rng. Called
  inside the mesh context."""
  cfg, init_fn, step_fn = finetune_step.engine(config)
  one = jax.tree.map(jnp.asarray, finetune_step.host_batch(config, cfg.vocab_size))
  stacked = jax.tree.map(lambda x: jnp.stack([x] * seeds), one)
  keys = jax.random.split(jax.random.key(0), seeds)
  states = [jax.jit(lambda r: nn.meta.unbox(init_fn(r)))(k) for k in keys]
  state_s = jax.jit(jax.vmap(lambda r: nn.meta.unbox(init_fn(r))))(keys)
  rngs = jax.random.split(jax.random.key(1), seeds)
  single = jax.jit(step_fn, donate_argnums=0)
  multi = jax.jit(jax.vmap(step_fn), donate_argnums=0)
  return single, multi, states, state_s, one, stacked, rngs


def main(argv):
  del argv
  config = finetune_step.bench_config(_SIZE.value, _SEQ.value, _BATCH.value, _DTYPE.value, {})
  mesh = sh.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  rules = sh.rules_from_config(config.mesh.rules)
  with sh.mesh_context(mesh, rules):
    single, multi, states, state_s, batch, batch_s, rngs = build(config, _SEEDS.value)

    def run_single():
      nonlocal states
      out = [single(st, batch, r) for st, r in zip(states, rngs, strict=True)]
      jax.block_until_ready(out)
      states = [st for st, _ in out]

    def run_multi():
      nonlocal state_s
      state_s, m = multi(state_s, batch_s, rngs)
      jax.block_until_ready(m)

    times = {run_single: [], run_multi: []}
    for r in range(_ROUNDS.value + 1):
      for f in (run_single, run_multi) if r % 2 == 0 else (run_multi, run_single):
        t0 = time.perf_counter()
        f()
        if r:  # round 0 compiles and warms up
          times[f].append(time.perf_counter() - t0)
  t_single, t_multi = (statistics.median(times[f]) for f in (run_single, run_multi))
  print(
    json.dumps(
      {
        "size": _SIZE.value,
        "seeds": _SEEDS.value,
        "batch": _BATCH.value,
        "seq": _SEQ.value,
        "dtype": _DTYPE.value,
        "backend": jax.devices()[0].platform,
        "single_steps_ms": round(t_single * 1e3, 1),
        "vmapped_step_ms": round(t_multi * 1e3, 1),
        "single_over_vmapped": round(t_single / t_multi, 3),
      }
    )
  )


if __name__ == "__main__":
  app.run(main)
