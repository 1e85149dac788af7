"""Kernel-level measurements the full benchmark is too coarse (and too slow to build) for, in one
GPU call of a few minutes: the flash kernels' tile sizes and launch parameters at BERT-Large's
attention shapes (`flash.BlockSizes`, the one-pass backward among them), the FFN's GELU
(autodiff; `jax.checkpoint`; and `layer_scan.recomputed_gelu`, remat_policy='gelu') in time
and temporaries, the Large state init's compile with and without JAX's CUDA threefry kernel,
and a cold build of Large 128 with that kernel and without XLA's autotuning
(`step.compile_step`, then its step time).

  bash tools/gpu/device_run.sh --tune          # on a GPU (the wheels, then this; < 5 minutes)
  python tools/gpu/tune_kernels.py --out=DIR [--deadline_s=240] [--only=flash,gelu,init,build]
  python tools/gpu/tune_kernels.py --smoke                         # on the CPU (interpret)

Each measurement is a JSON line in DIR/tune.jsonl (and on stdout); every flash configuration's
output and gradients are checked against the default tiles' (same hash mask), so a faster tile
that computes something else is reported as such. Timings: the median of 5 rounds of N calls
each (jitted forward + backward, `block_until_ready`), after a warm-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bert_jax.backends import dropout, flash  # noqa: E402

T0 = time.perf_counter()


def emit(out, rec):
  rec = {"t_s": round(time.perf_counter() - T0, 1), **rec}
  line = json.dumps(rec)
  print(line, flush=True)
  if out:
    with open(os.path.join(out, "tune.jsonl"), "a") as f:
      f.write(line + "\n")


def timed(fn, args, n):
  jax.block_until_ready(fn(*args))
  rounds = []
  for _ in range(5):
    t = time.perf_counter()
    for _ in range(n):
      r = fn(*args)
    jax.block_until_ready(r)
    rounds.append((time.perf_counter() - t) / n)
  return statistics.median(rounds)


def temp_gib(compiled):
  try:
    return compiled.memory_analysis().temp_size_in_bytes / 2**30
  except Exception:  # noqa: BLE001 - a backend without the analysis
    return None


# ----------------------------------------------------------------------------- flash tiles

CONFIGS = {  # in the order they run: the likeliest first, a deadline may cut the tail
  "default": {},
  "kv1p64x32": dict(one_pass_bwd=True),
  "kv1p128x32w8": dict(one_pass_bwd=True, dkv_k=128, dkv_q=32, dkv_warps=8),
  "f128x64": dict(fwd_q=128, fwd_k=64),
  "kv128x32w8": dict(dkv_k=128, dkv_q=32, dkv_warps=8),
  "q128x32w8": dict(dq_q=128, dq_k=32, dq_warps=8),
  "f128x128": dict(fwd_q=128, fwd_k=128),
  "kv128x32": dict(dkv_k=128, dkv_q=32),
  "q128x32": dict(dq_q=128, dq_k=32),
  "f128x64w8": dict(fwd_q=128, fwd_k=64, fwd_warps=8),
  "kv64x64": dict(dkv_k=64, dkv_q=64),
  "q64x64": dict(dq_k=64),
  "kv128x64w8": dict(dkv_k=128, dkv_q=64, dkv_warps=8),
  "q128x64w8": dict(dq_q=128, dq_k=64, dq_warps=8),
  "f64x64s3": dict(fwd_stages=3),
  "kv64x32s3": dict(dkv_stages=3),
  "q64x32s3": dict(dq_stages=3),
  "f128x32": dict(fwd_q=128, fwd_k=32),
  "kv64x16": dict(dkv_q=16),
  "kv1p128x32": dict(one_pass_bwd=True, dkv_k=128, dkv_q=32),
  "q64x16": dict(dq_k=16),
}


# At 128 tokens a tile of 128 is the whole length: fewer choices.
SHORT = (
  "default",
  "kv1p64x32",
  "f128x64",
  "f128x128",
  "kv128x32",
  "kv128x32w8",
  "q128x32",
  "q128x32w8",
)


def best_of(results):
  """The fastest fields per kernel: the forward's from the f* configurations (by fwd_ms), the
  dK/dV and dQ kernels' from the kv* and q* ones (by bwd_ms), where they beat the default."""
  base = results.get("default")
  fields = {}
  for prefix, key in (("f", "fwd_ms"), ("kv", "bwd_ms"), ("q", "bwd_ms")):
    cands = {c: r for c, r in results.items() if c.startswith(prefix) and c[len(prefix)].isdigit()}
    if base is None or not cands:
      continue
    c = min(cands, key=lambda c: cands[c][key])
    if cands[c][key] < base[key] and cands[c]["max_diff"] <= 0.05:
      fields.update(cands[c]["fields"])
  return fields


def _attention_inputs(b, h, length, k):
  """q, k, v and the output's cotangent [B, L, H, K] bf16, the input mask (the last eighth of
  each row's keys padding) and the dropout key."""
  ks = jax.random.split(jax.random.key(0), 5)
  q, kk, v, do = (jax.random.normal(x, (b, length, h, k), jnp.bfloat16) for x in ks[:4])
  mask = jnp.ones((b, length), jnp.int32).at[:, length - length // 8 :].set(0)
  return q, kk, v, do, mask, ks[4]


def _compiled(fwd, q, kk, v, do):
  """`fwd` (q, k, v -> o) compiled alone and with its backward: (forward, forward + backward
  returning (o, dq, dk, dv))."""

  def fwd_bwd(q, kk, v, do):
    o, vjp = jax.vjp(fwd, q, kk, v)
    return o, *vjp(do)

  return jax.jit(fwd).lower(q, kk, v).compile(), jax.jit(fwd_bwd).lower(q, kk, v, do).compile()


def _ms(t_fwd, t_all):
  return {
    "fwd_ms": round(t_fwd * 1e3, 4),
    "bwd_ms": round((t_all - t_fwd) * 1e3, 4),
    "total_ms": round(t_all * 1e3, 4),
  }


def flash_case(out, name, b, h, length, k, rate, configs, n, interpret, deadline):
  q, kk, v, do, mask, key = _attention_inputs(b, h, length, k)
  seed = dropout.hash_seed(key)
  ref = None
  results = {}
  todo = list(configs.items()) + [("best", None)]
  for cname, fields in todo:
    # The combination ("best") may start up to 10 s past the others' cut-off.
    if time.perf_counter() - T0 > deadline - (0 if fields is None else 10):
      emit(out, {"kind": "skipped", "case": name, "config": cname, "why": "deadline"})
      continue
    if fields is None:
      fields = best_of(results)
      if not fields:
        continue
    blocks = dataclasses.replace(flash.DEFAULT_BLOCKS, **fields)

    def fwd(q, kk, v, blocks=blocks):
      return flash.flash_attention(
        q, kk, v, mask, dropout_rate=rate, dropout_seed=seed, interpret=interpret, blocks=blocks
      )

    try:
      t = time.perf_counter()
      f_fwd, f_all = _compiled(fwd, q, kk, v, do)
      build_s = time.perf_counter() - t
      res = f_all(q, kk, v, do)
      if ref is None:
        ref = res
      diff = max(
        float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32))))
        for a, r in zip(res, ref, strict=True)
      )
      times = timed(f_fwd, (q, kk, v), n), timed(f_all, (q, kk, v, do), n)
    except Exception as e:  # noqa: BLE001 - one configuration's failure is a record
      emit(out, {"kind": "error", "case": name, "config": cname, "error": repr(e)[:400]})
      continue
    rec = {
      "kind": "flash", "case": name, "config": cname, "fields": fields, **_ms(*times),
      "build_s": round(build_s, 2), "max_diff": diff,
    }  # fmt: skip
    results[cname] = rec
    emit(out, rec)


def attention_refs(out, name, b, h, length, k, rate, n, interpret, deadline):
  """What the flash kernels' time is made of, at the same shape: the default tiles without
  dropout (the hash's and the select's share), cuDNN's fused attention without dropout (the
  library's floor; `attention.library_attention`) and the explicit attention with the same hash
  mask (`attention.explicit_attention`, XLA's fusions), each forward + backward."""
  from bert_jax import backends
  from bert_jax.backends import attention

  q, kk, v, do, mask, key = _attention_inputs(b, h, length, k)
  mask_b1qs = attention.attention_mask(mask, False, None)

  class _Drop:  # what explicit_attention asks of the model's Dropout: the 'hash' mask
    def __call__(self, x, deterministic):
      return dropout.dropout(x, dropout.keep_mask(key, x.shape, rate), rate)

  refs = {
    "flash, no dropout": lambda q, kk, v: flash.flash_attention(
      q, kk, v, mask, interpret=interpret
    ),
    "cudnn, no dropout": lambda q, kk, v: attention.library_attention(q, kk, v, mask_b1qs, "cudnn"),
    "explicit, hash dropout": lambda q, kk, v: attention.explicit_attention(
      q, kk, v, mask_b1qs, backends.XLA_OPS, _Drop()
    )[0],
  }
  for rname, fwd in refs.items():
    if time.perf_counter() - T0 > deadline:
      emit(out, {"kind": "skipped", "case": name, "config": rname, "why": "deadline"})
      continue
    try:
      f_fwd, f_all = _compiled(fwd, q, kk, v, do)
      times = timed(f_fwd, (q, kk, v), n), timed(f_all, (q, kk, v, do), n)
    except Exception as e:  # noqa: BLE001 - cuDNN where it cannot run, say
      emit(out, {"kind": "error", "case": name, "config": rname, "error": repr(e)[:400]})
      continue
    emit(out, {"kind": "attention_ref", "case": name, "config": rname, **_ms(*times)})


# ----------------------------------------------------------------------------- GELU


def _gelus():
  from bert_jax import layer_scan, model

  return {
    "autodiff": model.gelu,  # remat_policy='none': autodiff keeps a product, erfc and exp
    "checkpoint": jax.checkpoint(model.gelu),  # the earlier remat_policy='gelu'
    "recomputed": layer_scan.recomputed_gelu,  # today's remat_policy='gelu'
  }


def gelu_case(out, name, tokens, d, f, layers, n, deadline):
  ks = jax.random.split(jax.random.key(1), 2 * layers + 1)
  x = jax.random.normal(ks[0], (tokens, d), jnp.bfloat16)
  ws = [
    (
      (jax.random.normal(ks[2 * i + 1], (d, f), jnp.bfloat16) * 0.02),
      (jax.random.normal(ks[2 * i + 2], (f, d), jnp.bfloat16) * 0.02),
    )
    for i in range(layers)
  ]
  ref = None
  for gname, act in _gelus().items():
    if time.perf_counter() - T0 > deadline:
      emit(out, {"kind": "skipped", "case": name, "gelu": gname, "why": "deadline"})
      continue

    def fwd_only(ws, x, act=act):
      for w1, w2 in ws:
        x = x + act(x @ w1) @ w2
      return x

    def loss(ws, x, fwd_only=fwd_only):
      return jnp.sum(fwd_only(ws, x).astype(jnp.float32) ** 2)

    try:
      g = jax.jit(jax.grad(loss)).lower(ws, x).compile()
      f_ = jax.jit(fwd_only).lower(ws, x).compile()
      res = g(ws, x)
      flat = jnp.concatenate([a.astype(jnp.float32).ravel() for a in jax.tree.leaves(res)])
      if ref is None:
        ref = flat
      rel = float(jnp.linalg.norm(flat - ref) / jnp.linalg.norm(ref))
      t_all = timed(g, (ws, x), n)
      t_fwd = timed(f_, (ws, x), n)
    except Exception as e:  # noqa: BLE001
      emit(out, {"kind": "error", "case": name, "gelu": gname, "error": repr(e)[:400]})
      continue
    emit(out, {
      "kind": "gelu", "case": name, "gelu": gname, "total_ms": round(t_all * 1e3, 4),
      "fwd_ms": round(t_fwd * 1e3, 4), "temp_gib": temp_gib(g), "grad_rel_diff": rel,
    })  # fmt: skip


# ----------------------------------------------------------------------------- init compile


def init_case(out, size, seq, batch, flags, deadline):
  """The state init the benchmark compiles beside the step (`step.prepare`'s), lowered with and
  without JAX's CUDA threefry kernel: its compile and run times, and a checksum of the state
  (the same threefry2x32 values either way)."""
  from bert_jax.benchmark import gpu_ours
  from bert_jax.benchmark import step as step_lib

  for flag in flags:
    if time.perf_counter() - T0 > deadline:
      emit(out, {"kind": "skipped", "case": f"init {size}", "flag": flag, "why": "deadline"})
      continue
    try:
      with gpu_ours.jax_options({"jax_threefry_gpu_kernel_lowering": flag}):
        p = step_lib.prepare(step_lib.bench_config(size, seq, batch, "bfloat16", {}))
      t = time.perf_counter()
      compiled = p.init_lowered.compile()
      compile_s = time.perf_counter() - t
      t = time.perf_counter()
      state = jax.block_until_ready(compiled(p.init_rng))
      run_s = time.perf_counter() - t
      checksum = float(sum(jnp.sum(jnp.abs(x.astype(jnp.float32))) for x in jax.tree.leaves(state)))
      del state, p
    except Exception as e:  # noqa: BLE001
      emit(out, {"kind": "error", "case": f"init {size}", "flag": flag, "error": repr(e)[:400]})
      continue
    emit(out, {
      "kind": "init", "case": f"init {size}", "threefry_gpu_kernel": flag,
      "compile_s": round(compile_s, 2), "run_s": round(run_s, 2), "checksum": checksum,
    })  # fmt: skip


# ----------------------------------------------------------------------------- a cold build


def build_case(out, size, seq, batch, variant, deadline, steps=20):
  """The benchmark's cold build (`step.compile_step`: the step and the init compiled side by
  side) with a variant's JAX and XLA options, then its step time."""
  from bert_jax.benchmark import gpu_ours
  from bert_jax.benchmark import step as step_lib

  if time.perf_counter() - T0 > deadline:
    emit(out, {"kind": "skipped", "case": f"build {size} {seq}", "variant": variant})
    return
  fields, opts = gpu_ours.split_variant(variant)
  try:
    with gpu_ours.jax_options(variant):
      p = step_lib.prepare(step_lib.bench_config(size, seq, batch, "bfloat16", fields))
    st = step_lib.compile_step(p, opts, materialize=True)
    step_lib.run_steps(st, 3)
    times, losses = step_lib.run_steps(st, steps)
  except Exception as e:  # noqa: BLE001
    emit(out, {"kind": "error", "case": f"build {size} {seq}", "error": repr(e)[:400]})
    return
  emit(out, {
    "kind": "build", "case": f"build {size} {seq} x {batch}", "variant": variant,
    "lower_s": round(st.lower_s, 2), "compile_s": round(st.compile_s, 2),
    "init_compile_s": round(st.init_compile_s, 2), "build_s": round(st.build_s, 2),
    "step_ms": round(statistics.median(times) * 1e3, 3),
    "seq_per_s": round(batch / statistics.median(times)),
    "loss_last": losses[-1],
  })  # fmt: skip


CASES = {"flash", "gelu", "init", "build"}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="")
  ap.add_argument("--deadline_s", type=float, default=240.0)
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--only", default="flash,gelu,init,build")
  a = ap.parse_args()
  if a.out:
    os.makedirs(a.out, exist_ok=True)
  only = set(a.only.split(","))
  if only - CASES:
    unknown, known = ",".join(sorted(only - CASES)), ",".join(sorted(CASES))
    ap.error(f"--only: unknown {unknown}; choose from {known}")
  emit(a.out, {"kind": "env", "devices": [d.device_kind for d in jax.devices()],
               "jax": jax.__version__})  # fmt: skip
  if a.smoke:
    configs = {k: CONFIGS[k] for k in ("default", "kv1p64x32", "f128x64", "kv128x32w8", "q64x16")}
    if "flash" in only:
      flash_case(a.out, "smoke", 2, 2, 40, 16, 0.1, configs, 1, True, a.deadline_s)
      attention_refs(a.out, "smoke", 2, 2, 40, 16, 0.1, 1, True, a.deadline_s)
    if "gelu" in only:
      gelu_case(a.out, "smoke", 64, 16, 64, 2, 1, a.deadline_s)
    if "init" in only:
      init_case(a.out, "tiny", 32, 4, [False], a.deadline_s)
    if "build" in only:
      build_case(a.out, "tiny", 32, 4, {"xla_cpu_enable_fast_math": False}, a.deadline_s, 2)
    return
  d = a.deadline_s
  fast = {"jax_threefry_gpu_kernel_lowering": True, "xla_gpu_autotune_level": 0}
  # In order of what they decide: Large 512's attention (the largest gap to cuDNN), the GELU
  # residuals (Large 512's memory; Large 128's FFN has the same 32,768 tokens), the init's
  # compile with JAX's threefry kernel, Large 128's attention, then the cold build of Large 128
  # with both compile-time options and the init's compile without the kernel (the baseline).
  if "flash" in only:
    flash_case(a.out, "large 512 x 64", 64, 16, 512, 64, 0.1, CONFIGS, 20, False, d * 0.35)
    attention_refs(a.out, "large 512 x 64", 64, 16, 512, 64, 0.1, 20, False, d * 0.4)
  if "gelu" in only:
    gelu_case(a.out, "large 512 x 64", 64 * 512, 1024, 4096, 4, 10, d * 0.45)
  if "init" in only:
    init_case(a.out, "large", 128, 256, [True], d * 0.5)
  if "flash" in only:
    short = {k: v for k, v in CONFIGS.items() if k in SHORT}
    flash_case(a.out, "large 128 x 256", 256, 16, 128, 64, 0.1, short, 20, False, d * 0.6)
  if "build" in only:
    build_case(a.out, "large", 128, 256, fast, d * 0.65)
  if "init" in only:
    init_case(a.out, "large", 128, 256, [False], d * 0.75)
  emit(a.out, {"kind": "done"})


if __name__ == "__main__":
  main()
