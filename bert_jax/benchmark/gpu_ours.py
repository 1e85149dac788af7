"""Our side of the GPU comparison (`gpu.py`): a worker process that builds every planned step,
then times them when the parent says so.

Build phase: each plan in priority order is lowered here (tracing holds the GIL anyway) and
compiled in a thread pool (XLA's compile releases the GIL, so several compile at once); a plan
whose estimated compile time does not fit before `build_until` is skipped and says so, and the
estimates are scaled by how far the finished compiles overran theirs. No step runs in this
phase: the state is on the device, the activations are not (the PyTorch side builds beside us).
Timing phase (after the parent's `time`, when nothing else runs on the device): the bf16
matmul peak of this process, then each built step, smallest first, `warmup` untimed steps and
`reps` runs of `steps` back-to-back steps, its state freed after it so the largest runs last
with the most memory.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax import compile_cache
from bert_jax.benchmark import finetune_step, host, memory, protocol
from bert_jax.benchmark import step as step_lib

DTYPE = "bfloat16"  # compute dtype; params stay float32


def _config(plan: dict[str, Any]):
  """The trainer's (or the fine-tuning recipe's) config of a plan."""
  lib = finetune_step if plan["task"] == "finetune" else step_lib
  return lib.bench_config(plan["size"], plan["seq"], plan["batch"], DTYPE, dict(plan["variant"]))


def _prepare(plan: dict[str, Any]) -> step_lib.Prepared:
  lib = finetune_step if plan["task"] == "finetune" else step_lib
  return lib.prepare(_config(plan))


def _base(plan: dict[str, Any]) -> dict[str, Any]:
  keys = ("id", "side", "impl", "task", "size", "seq", "batch", "variant")
  return {k: plan[k] for k in keys}


def _matmul(n: int):
  """A jitted n x n bf16 matmul (f32 accumulation, as the model's dots), compiled now."""
  x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(jnp.bfloat16)
  f = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
  return f.lower(x).compile(), x


def build(spec: dict[str, Any]) -> list[tuple[dict[str, Any], step_lib.Step]]:
  """The build phase; returns the built (plan, step) pairs."""
  until = spec["build_until"]
  scale = [1.0]  # how far finished compiles overran their estimates (the largest overrun)

  def compile_job(plan: dict[str, Any], prepared: step_lib.Prepared) -> step_lib.Step | None:
    if time.time() + plan["est_compile_s"] * scale[0] > until:
      return None  # waited in the queue past the point where it could still fit
    st = step_lib.compile_step(prepared)
    scale[0] = max(scale[0], (st.lower_s + st.compile_s) / plan["est_compile_s"])
    return st

  built, jobs = [], []
  with concurrent.futures.ThreadPoolExecutor(max(1, spec["compile_threads"])) as pool:
    for plan in spec["plans"]:
      if time.time() + plan["est_compile_s"] * scale[0] > until:
        protocol.print_record({**_base(plan), "kind": "skipped", "why": "build deadline"})
        continue
      try:
        prepared = _prepare(plan)
      except Exception as e:  # noqa: BLE001 - one plan's failure is a record, the rest go on
        protocol.print_record({**_base(plan), "kind": "error", "error": protocol.error_text(e)})
        continue
      jobs.append((plan, pool.submit(compile_job, plan, prepared)))
      del prepared
    for plan, job in jobs:
      try:
        st = job.result()
      except Exception as e:  # noqa: BLE001
        protocol.print_record({**_base(plan), "kind": "error", "error": protocol.error_text(e)})
        continue
      if st is None:
        protocol.print_record({**_base(plan), "kind": "skipped", "why": "build deadline"})
        continue
      protocol.print_record(
        {
          **_base(plan),
          "kind": "built",
          "compile_s": st.lower_s + st.compile_s,
          "lower_s": st.lower_s,
          "compile_cache_hit": st.cache_hit,
          "mem_gib": memory.step_gib(st.compiled),
          "kernels": st.cfg.kernels,
        }
      )
      built.append((plan, st))
  return built


def time_built(spec: dict[str, Any], built: list, matmul: tuple[Any, Any]) -> None:
  """The timing phase: this process's matmul peak, then every built step."""
  f, x = matmul
  times = host.time_calls(lambda: jax.block_until_ready(f(x)), reps=10)
  n = x.shape[0]
  protocol.print_record(
    {
      "side": "ours",
      "kind": "peak",
      "dtype": DTYPE,
      "matmul_n": n,
      "tflops": 2 * n**3 / min(times) / 1e12,
    }
  )
  steps, reps = spec["steps"], spec["reps"]
  for plan, st in sorted(built, key=lambda b: b[0]["est_mem"]):
    rec = _base(plan)
    need = plan["est_step_s"] * (spec["warmup"] + steps * reps)
    if time.time() + need > spec["end_by"]:
      protocol.print_record({**rec, "kind": "skipped", "why": "timing deadline"})
      continue
    try:
      t0 = time.perf_counter()
      first, warm_losses = step_lib.run_steps(st, 1)
      _, more = step_lib.run_steps(st, max(0, spec["warmup"] - 1))
      warm_losses += more
      warmup_s = time.perf_counter() - t0
      metrics: list[Any] = []

      def run_n(k: int, st=st, metrics=metrics) -> None:
        for _ in range(k):
          st.state, m = st.compiled(st.state, st.batch, st.rng)
        jax.block_until_ready((st.state, m))
        metrics[:] = [m]

      per_step = host.per_step_reps(run_n, steps, reps)
      protocol.print_record(
        {
          **rec,
          "kind": "step",
          "step_s": min(per_step),
          "step_s_all": per_step,
          "step_s_median": statistics.median(per_step),
          "first_step_s": first[0],
          "warmup_s": warmup_s,
          "losses": warm_losses + [float(metrics[0]["loss"])],
        }
      )
    except Exception as e:  # noqa: BLE001
      protocol.print_record({**rec, "kind": "error", "error": protocol.error_text(e)})
    finally:
      st.state = None  # frees this step's state for the larger ones after it


def session(spec: dict[str, Any]) -> None:
  """The worker: env record, build phase, READY, then on `time` the timing phase, RESULT."""
  dev = jax.devices()[0]
  protocol.print_record(
    {
      "side": "ours",
      "kind": "env",
      "jax": jax.__version__,
      "platform": dev.platform,
      "device_kind": dev.device_kind,
      "device": str(dev),
      "compile_cache": compile_cache.active_dir(),
    }
  )
  matmul = _matmul(spec["matmul_n"])
  built = build(spec)
  print(protocol.READY_MARK, flush=True)
  if sys.stdin.readline().strip() == "time":
    time_built(spec, built, matmul)
  protocol.print_result({"side": "ours", "built": len(built)})
