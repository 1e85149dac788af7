"""Our side of the GPU comparison (`gpu.py`): a worker process that builds every planned step,
then times them when the parent says so.

Build phase: the plans in their build order (`gpu_plan.build_order`: the shapes longest first,
then the variants by priority) are lowered here against their abstract states (tracing holds
the GIL anyway) and compiled, each with its state's init, in a thread pool (XLA's compile
releases the GIL, so several compile at once); each `built` record is printed as its compile
ends. A shape always builds; a variant whose estimated compile no longer fits before
`build_until` (estimates scaled by how far the finished compiles overran theirs) is skipped and
says so. Nothing runs on the device in this phase, and no state holds its memory (the PyTorch
side builds beside us). Timing phase (after the parent's `time`, when nothing else runs on the
device): this process's bf16 matmul peaks, then each built step, its state made now, `warmup`
untimed steps and `reps` runs of `steps` back-to-back steps, its state freed after it: the
shapes smallest first, then the profiles (`profile.py`), then the variants (those on standby
last), each variant only if it still fits before `end_by`.
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax import compile_cache
from bert_jax.benchmark import finetune_step, gpu_plan, host, memory, profile, protocol
from bert_jax.benchmark import step as step_lib

DTYPE = "bfloat16"  # compute dtype; params stay float32


def split_variant(variant: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """(model fields, XLA compiler options): `xla_*` keys are options of this plan's executable
  only (`compile(compiler_options=...)`), the rest are BertConfig fields."""
  opts = {k: v for k, v in variant.items() if k.startswith("xla_")}
  return {k: v for k, v in variant.items() if k not in opts}, opts


def prepare_plan(plan: dict[str, Any], delay_s: float = 0.0) -> step_lib.Prepared:
  """A plan's step lowered against its abstract state (`step.prepare`; fine-tuning's
  `finetune_step.prepare`). `delay_s` first: the tests' stand-in for a loaded host."""
  if delay_s:
    time.sleep(delay_s)
  lib = finetune_step if plan["task"] == "finetune" else step_lib
  fields, _ = split_variant(plan["variant"])
  return lib.prepare(lib.bench_config(plan["size"], plan["seq"], plan["batch"], DTYPE, fields))


def _base(plan: dict[str, Any]) -> dict[str, Any]:
  keys = ("id", "side", "impl", "task", "size", "seq", "batch", "variant")
  return {k: plan[k] for k in keys}


def _matmuls(n: int) -> dict[str, tuple[Any, Any]]:
  """Jitted n x n bf16 matmuls, compiled now: with a bf16 result (as PyTorch's `a @ a`; the
  accumulation is float32 in either) and with a float32 result (as the model's dots)."""
  x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(jnp.bfloat16)
  out = {}
  for name, kw in (("bf16", {}), ("f32out", {"preferred_element_type": jnp.float32})):
    f = jax.jit(lambda a, kw=kw: jnp.dot(a, a, **kw))
    out[name] = (f.lower(x).compile(), x)
  return out


def build(
  spec: dict[str, Any], prepare: Callable[..., step_lib.Prepared] = prepare_plan
) -> list[tuple[dict[str, Any], step_lib.Step]]:
  """The build phase; returns the built (plan, step) pairs. In `spec["build_order"]` (the
  shapes longest first, then the variants), each plan is lowered here against its abstract
  state (tracing holds the GIL) and compiled, with its state's init, in a pool of
  `compile_threads` (XLA's compile releases the GIL); its `built` record is printed as its
  compile ends. A shape always builds; a variant only if its estimate, scaled by how far the
  finished compiles overran theirs, still fits before `build_until`. No state is made."""
  until = spec["build_until"]
  scale = [1.0]
  by_id = {p["id"]: p for p in spec["plans"]}
  order = [by_id[i] for i in spec.get("build_order") or by_id if by_id[i]["role"] != "profile"]

  def fits(plan: dict[str, Any]) -> bool:
    late = time.time() + plan["est_compile_s"] * scale[0] > until
    return plan["role"] == "shape" or not late

  def compile_job(plan: dict[str, Any], prepared: step_lib.Prepared) -> step_lib.Step | None:
    if not fits(plan):  # waited in the queue past the point where it could still fit
      protocol.print_record({**_base(plan), "kind": "skipped", "why": "build deadline"})
      return None
    st = step_lib.compile_step(prepared, split_variant(plan["variant"])[1], materialize=False)
    scale[0] = max(scale[0], (st.lower_s + st.compile_s) / max(plan["est_compile_s"], 1e-9))
    protocol.print_record(
      {
        **_base(plan),
        "kind": "built",
        "compile_s": st.lower_s + st.compile_s,
        "lower_s": st.lower_s,
        "init_compile_s": st.init_compile_s,
        "compile_cache_hit": st.cache_hit,
        "mem_gib": memory.step_gib(st.compiled),
        "kernels": st.cfg.kernels,
        "dropout_rng": st.cfg.dropout_rng,
      }
    )
    return st

  built, jobs = [], []
  with concurrent.futures.ThreadPoolExecutor(max(1, spec["compile_threads"])) as pool:
    for plan in order:
      if not fits(plan):
        protocol.print_record({**_base(plan), "kind": "skipped", "why": "build deadline"})
        continue
      try:
        prepared = prepare(plan, spec.get("prepare_delay_s", 0.0))
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
      if st is not None:
        built.append((plan, st))
  return built


def _timing_order(spec: dict[str, Any], built: list) -> list[tuple[dict[str, Any], Any]]:
  """The shapes smallest first (the largest runs with the most memory), then the profiles,
  then the variants in priority order (standby ones last): a late run drops variants."""
  shapes = sorted((b for b in built if b[0]["role"] == "shape"), key=lambda b: b[0]["est_mem"])
  profiles = [(p, None) for p in spec["plans"] if p["role"] == "profile"]
  variants = sorted((b for b in built if b[0]["role"] == "variant"),
                    key=lambda b: (bool(b[0].get("standby")), b[0]["priority"]))  # fmt: skip
  return shapes + profiles + variants


def _peaks(matmuls: dict[str, tuple[Any, Any]]) -> None:
  """This process's bf16 matmul TFLOP/s, bf16 result (`tflops`) and float32 result."""
  rec: dict[str, Any] = {"side": "ours", "kind": "peak", "dtype": DTYPE}
  for name, (f, x) in matmuls.items():
    times = host.time_calls(lambda f=f, x=x: jax.block_until_ready(f(x)), reps=10)
    n = x.shape[0]
    rec["matmul_n"] = n
    rec["tflops" if name == "bf16" else f"tflops_{name}"] = 2 * n**3 / min(times) / 1e12
  protocol.print_record(rec)


def time_built(spec: dict[str, Any], built: list, matmuls: dict[str, tuple[Any, Any]]) -> None:
  """The timing phase: this process's matmul peaks, then every built step (its state made
  now and freed after it) and the profiles, in `_timing_order`."""
  _peaks(matmuls)
  steps, reps = spec["steps"], spec["reps"]
  by_id = {plan["id"]: (plan, st) for plan, st in built}
  for plan, st in _timing_order(spec, built):
    if plan["role"] == "profile":
      profile_plan(spec, plan, by_id.get(plan["of"]))
      continue
    rec = _base(plan)
    need = plan["est_step_s"] * (spec["warmup"] + steps * reps)
    if plan["role"] != "shape" and time.time() + need > spec["end_by"]:
      protocol.print_record({**rec, "kind": "skipped", "why": "timing deadline"})
      continue
    try:
      st.state = st.fresh_state()
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


def profile_plan(spec: dict[str, Any], plan: dict[str, Any], pair) -> None:
  """One traced step of a built plan (`profile.profile_step`), after two untimed ones on a
  fresh state, as a `profile` record."""
  if pair is None:
    protocol.print_record({**_base(plan), "kind": "skipped", "why": "its step was not built"})
    return
  if time.time() + gpu_plan.PROFILE_S / 2 > spec["end_by"]:
    protocol.print_record({**_base(plan), "kind": "skipped", "why": "timing deadline"})
    return
  of, st = pair
  log_dir = spec.get("profile_dir")
  try:
    st.state = st.fresh_state()
    step_lib.run_steps(st, 2)

    def one() -> None:
      st.state, m = st.compiled(st.state, st.batch, st.rng)
      jax.block_until_ready((st.state, m))

    where = os.path.join(log_dir, of["id"]) if log_dir else None
    rec = profile.profile_step(one, st.compiled.as_text(), steps=1, log_dir=where)
    protocol.print_record({**_base(of), "id": plan["id"], "of": of["id"], "kind": "profile", **rec})
  except Exception as e:  # noqa: BLE001 - a failed profile is a record; the timings stand
    protocol.print_record({**_base(plan), "kind": "error", "error": protocol.error_text(e)})
  finally:
    st.state = None


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
  matmuls = _matmuls(spec["matmul_n"])
  built = build(spec)
  print(protocol.READY_MARK, flush=True)
  if sys.stdin.readline().strip() == "time":
    time_built(spec, built, matmuls)
  protocol.print_result({"side": "ours", "built": len(built)})
