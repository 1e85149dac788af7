"""What the GPU comparison (`gpu.py`) runs, in which order, and what fits its deadline.

A plan is one step to build and time: ours (the trainer's step at a shape, or a variant of it:
model fields, or `xla_*` XLA options compiled into that executable only) or PyTorch's (eager or
torch.compile at a shape, or a peer variant: `side=torch,attention_dropout_prob=0`). Each
carries estimates of its build and step time, from the H100 run of 2026-11-27 (docs/gpu.md,
docs/gpu-runs/2026-11-27-h100/).

Admission (`admit`): in priority order (the shapes on both sides, then the profile of our
first shape, then the variants as listed), a plan is taken only if the whole run, simulated
with the plans taken so far, still ends before the deadline: our compiles `compile_threads` at
a time, the longest (the shapes) started first, lowering on the main thread; PyTorch's builds
one after another; then PyTorch's timing phase, then ours (states made, warm-up, the timed
runs, the profile). So a variant never takes the place of a shape, and what does not fit is
reported before anything runs. `format_plan` prints the simulated schedule (`--dry_run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bert_jax.benchmark import peers, sizes, suite

# Shape names (`--shapes`): task, size, seq, batch.
SHAPES = {
  "base128": ("pretrain", "base", 128, 256),
  "large128": ("pretrain", "large", 128, 256),
  "large512": ("pretrain", "large", 512, 64),
  "ft_base128": ("finetune", "base", 128, 32),
  # The CPU smoke run's stand-ins (`--gpu_smoke`).
  "tiny128": ("pretrain", "tiny", 128, 8),
  "tiny64": ("pretrain", "tiny", 64, 4),
  "ft_tiny128": ("finetune", "tiny", 128, 8),
}
DEFAULT_SHAPES = ("base128", "large128", "large512")
SMOKE_SHAPES = ("tiny128", "tiny64", "ft_tiny128")
SHAPE_KEYS = ("task", "size", "seq", "batch")

# The default variants, in priority order; each at the first shape unless it says otherwise
# (`size=`, `seq=`, `batch=`, `task=`). They answer the open GPU questions (docs/gpu.md): the
# dropout bits, the fused attentions (flash keeps attention dropout; cuDNN's needs it off, so
# PyTorch is timed at that setting too), the XLA options that matter on Hopper, and scanned
# layers' compile time at Base and Large.
VARIANTS = (
  "dropout_rng=hash;"
  "dropout_rng=rbg;"
  "attention_impl=flash;"
  "attention_impl=explicit_lowp;"
  "dropout_rng=hash,attention_impl=flash;"
  "attention_impl=cudnn,attention_dropout_prob=0;"
  "side=torch,attention_dropout_prob=0;"
  "dropout_rng=hash_redraw;"
  "kernels=lowp;"
  "xla_gpu_enable_triton_gemm=False;"
  "xla_gpu_autotune_level=0;"
  "xla_gpu_enable_cublaslt=True;"
  "xla_gpu_enable_command_buffer=;"
  "scan_layers=True;"
  "scan_layers=True,unroll_last_layer=True;"
  "size=large,scan_layers=True"
)
SMOKE_VARIANTS = "hidden_dropout_prob=0.0;scan_layers=True"
# Peer-variant fields (HF BertConfig's dropouts) and keys.
TORCH_FIELDS = ("attention_dropout_prob", "hidden_dropout_prob")

# H100 80GB, 2026-11-27 (docs/gpu-runs/2026-11-27-h100): ours lower + compile (+ init) in s,
# torch.compile's first step in s, steps in s; rounded up. Large 512's compile was not
# measured (the H200 took 3% longer for it than for Large 128). Keys: (task, size, seq).
EST_BUILD_S = {
  "ours": {
    ("pretrain", "base", 128): 65,
    ("pretrain", "large", 128): 170,
    ("pretrain", "large", 512): 175,
    ("finetune", "base", 128): 80,
  },
  "compile": {
    ("pretrain", "base", 128): 45,
    ("pretrain", "large", 128): 65,
    ("pretrain", "large", 512): 105,
    ("finetune", "base", 128): 30,
  },
}
EST_STEP_S = {
  "ours": {
    ("pretrain", "base", 128): 0.076,
    ("pretrain", "large", 128): 0.21,
    ("pretrain", "large", 512): 0.26,
    ("finetune", "base", 128): 0.03,
  },
  "compile": {
    ("pretrain", "base", 128): 0.068,
    ("pretrain", "large", 128): 0.174,
    ("pretrain", "large", 512): 0.2,
    ("finetune", "base", 128): 0.02,
  },
  "eager": {
    ("pretrain", "base", 128): 0.102,
    ("pretrain", "large", 128): 0.231,
    ("pretrain", "large", 512): 0.246,
    ("finetune", "base", 128): 0.039,
  },
}
EAGER_BUILD_S = 10  # the model on the device and its first steps (2-16 s on the H100)
# Scanned layers compile one layer body (Base 17 s against 60, Large 21 against 161) and step
# slower (Base 115 ms against 75); no autotuning compiles faster.
VARIANT_COMPILE_SCALE = (("scan_layers", True, 0.3), ("xla_gpu_autotune_level", 0, 0.8))
VARIANT_STEP_SCALE = (("scan_layers", True, 1.6),)
SMOKE_BUILD_S, SMOKE_STEP_S = 20.0, 0.05  # the CPU smoke run's (tiny)
# Around the phases: a worker's start (imports, the device, its matmul peaks compiled), our
# lowering per plan (on the main thread), per timed plan the state's init and the first call,
# each side's matmul peaks and exit, a profile (trace, export, parse), the parent's margin.
START_S = {"ours": 10.0, "torch": 15.0}
LOWER_S_PER_LAYER = 0.35
PLAN_OVERHEAD_S = 3.0
SIDE_OVERHEAD_S = 8.0
PROFILE_S = 30.0
MARGIN_S = 10.0


def shape_of(name: str) -> dict[str, Any]:
  """A shape name's task, size, seq and batch."""
  if name not in SHAPES:
    raise ValueError(f"--shapes: unknown shape {name!r}; choose from {', '.join(SHAPES)}")
  return dict(zip(SHAPE_KEYS, SHAPES[name], strict=True))


def _lookup(table: dict, task: str, size: str, seq: int) -> float:
  """An estimate for (task, size, seq), else Base's at that task scaled by layers x length."""
  key = (task, size, seq)
  if key in table:
    return table[key]
  base = table[(task, "base", 128)] if (task, "base", 128) in table else next(iter(table.values()))
  return base * sizes.size_fields(size)["num_layers"] / 12 * max(1.0, seq / 128)


def _scale(variant: dict[str, Any], rules) -> float:
  out = 1.0
  for key, value, factor in rules:
    if key in variant and suite.parse_value(str(variant[key])) == value:
      out *= factor
  return out


def estimates(side: str, shape: dict[str, Any], variant: dict[str, Any], smoke: bool):
  """(build seconds, step seconds) of a plan; `side` is "ours", "eager" or "compile"."""
  if smoke:
    return SMOKE_BUILD_S, SMOKE_STEP_S
  task, size, seq = shape["task"], shape["size"], shape["seq"]
  step_s = _lookup(EST_STEP_S[side], task, size, seq) * _scale(variant, VARIANT_STEP_SCALE)
  if side == "eager":
    return float(EAGER_BUILD_S), step_s
  build = _lookup(EST_BUILD_S[side], task, size, seq) * _scale(variant, VARIANT_COMPILE_SCALE)
  return build, step_s


def _moved(fields: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
  """A variant's shape: the default one with its `task`/`size`/`seq`/`batch` keys applied
  (and taken out of `fields`)."""
  shape = dict(default)
  for k in SHAPE_KEYS:
    if k in fields:
      shape[k] = type(shape[k])(fields.pop(k))
  if shape["task"] not in peers.TASKS:
    raise ValueError(f"--variants task={shape['task']!r}: use one of {', '.join(peers.TASKS)}")
  sizes.size_fields(shape["size"])  # an unknown size: one line
  return shape


def make_plans(
  smoke: bool = False,
  variants: Sequence[dict[str, Any]] | None = None,
  torch_modes: Sequence[str] = ("eager", "compile"),
  shapes: Sequence[str] | None = None,
  profile: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
  """Every plan in priority order: our shapes, PyTorch's (eager, then torch.compile), the
  profiles (of our step at the `profile` shapes; default: the first shape), then the variants
  in the order given (default `VARIANTS`; [] for none; a `side=torch` variant is the peer of
  the variant of ours just before it). Each plan has an id, its side, shape, variant,
  `priority` and `role` ("shape", "profile" or "variant") and its estimates."""
  names = list(shapes or (SMOKE_SHAPES if smoke else DEFAULT_SHAPES))
  shape_list = [shape_of(n) for n in names]
  for mode in torch_modes:
    if mode not in ("eager", "compile"):
      raise ValueError(f"--torch_modes: unknown mode {mode!r}; use eager, compile")
  if variants is None:
    variants = suite.parse_variants(SMOKE_VARIANTS if smoke else VARIANTS)
  profile = names[:1] if profile is None else list(profile)
  for p in profile:
    if p not in names:
      raise ValueError(f"--profile: {p!r} is not one of --shapes ({', '.join(names)})")
  plans: list[dict[str, Any]] = []

  def add(side: str, mode: str, shape: dict[str, Any], variant: dict[str, Any], role: str):
    est_build, est_step = estimates(mode, shape, variant, smoke)
    plan = {
      "id": f"{side}{sum(p['side'] == side for p in plans)}",
      "side": side,
      "role": role,
      "priority": len(plans),
      **shape,
      "variant": variant,
      "est_compile_s": est_build,
      "est_step_s": est_step,
      "est_mem": _mem_key(shape),
    }
    if side == "ours":
      plan["impl"] = "bert_jax"
    else:
      impl = "torch_compile" if mode == "compile" else "torch"
      tfields = {k: float(v) for k, v in variant.items()}
      plan.update(peers.peer_spec(impl, "bfloat16", shape["size"], shape["seq"], shape["batch"],
                                  shape["task"]))  # fmt: skip
      plan.update(
        impl=impl,
        mode=mode,
        attn="sdpa",
        clip_norm=1.0,
        variant=variant,
        dropout=tfields.get("hidden_dropout_prob", 0.1),
        attention_dropout=tfields.get("attention_dropout_prob", 0.1),
      )
    plans.append(plan)

  for shape in shape_list:
    add("ours", "ours", shape, {}, "shape")
  for mode in torch_modes:
    for shape in shape_list:
      add("torch", mode, shape, {}, "shape")
  for name in profile:
    ours = next(p for p in plans if p["side"] == "ours" and p["role"] == "shape"
                and shape_of(name) == {k: p[k] for k in SHAPE_KEYS})  # fmt: skip
    plans.append(
      {"id": f"profile:{ours['id']}", "side": "ours", "role": "profile",
       "priority": len(plans), "of": ours["id"], **{k: ours[k] for k in SHAPE_KEYS},
       "impl": "bert_jax", "variant": {}, "est_compile_s": 0.0,
       "est_step_s": 0.0, "est_mem": ours["est_mem"]}
    )  # fmt: skip
  for v in variants:
    fields = dict(v)
    side = str(fields.pop("side", "ours"))
    shape = _moved(fields, shape_list[0])
    if side == "torch":
      bad = sorted(set(fields) - set(TORCH_FIELDS) - {"mode"})
      if bad:
        raise ValueError(
          f"--variants side=torch: {', '.join(bad)} not one of mode, {', '.join(TORCH_FIELDS)}"
        )
      mode = str(fields.pop("mode", "compile" if "compile" in torch_modes else "eager"))
      if mode in torch_modes:  # no PyTorch side, or not that mode: no peer variant
        add("torch", mode, shape, fields, "variant")
        # The peer of the variant of ours listed just before it: admitted only with it.
        partner = [q for q in plans if q["side"] == "ours" and q["role"] == "variant"]
        if partner and partner[-1]["priority"] == plans[-1]["priority"] - 1:
          plans[-1]["with"] = partner[-1]["id"]
    elif side == "ours":
      add("ours", "ours", shape, fields, "variant")
    else:
      raise ValueError(f"--variants side={side!r}: use ours or torch")
  return plans


def _mem_key(shape: dict[str, Any]) -> int:
  """An order of the plans' step memory (activations ~ tokens x layers x hidden)."""
  f = sizes.size_fields(shape["size"])
  return shape["batch"] * shape["seq"] * f["num_layers"] * f["hidden_size"]


def lower_s(plan: dict[str, Any], smoke: bool) -> float:
  """Seconds our main thread spends lowering a plan (tracing holds the GIL)."""
  return 0.0 if smoke else LOWER_S_PER_LAYER * sizes.size_fields(plan["size"])["num_layers"]


def build_order(plans: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Our builds in the order they start: the shapes longest first, then the variants by
  priority (so a late run drops the last variants, never a shape)."""
  ours = [p for p in plans if p["side"] == "ours" and p["role"] != "profile"]
  shapes = sorted((p for p in ours if p["role"] == "shape"), key=lambda p: -p["est_compile_s"])
  return shapes + [p for p in ours if p["role"] == "variant"]


def simulate(
  plans: Sequence[dict[str, Any]],
  steps: int,
  reps: int,
  warmup: int,
  compile_threads: int,
  smoke: bool = False,
) -> dict[str, Any]:
  """The planned run of `plans`: each build's start and end (s from the start), when the
  build phase ends, each side's timing phase and the run's end."""
  at: dict[str, tuple[float, float]] = {}
  main = START_S["ours"]
  slots = [main] * max(1, compile_threads)
  for p in build_order(plans):
    main += lower_s(p, smoke)
    i = min(range(len(slots)), key=slots.__getitem__)
    start = max(main, slots[i])
    slots[i] = start + p["est_compile_s"]
    at[p["id"]] = (start, slots[i])
  t = START_S["torch"]
  for p in plans:
    if p["side"] == "torch":
      at[p["id"]] = (t, t + p["est_compile_s"])
      t += p["est_compile_s"]
  sides = {p["side"] for p in plans}
  build_end = max([e for _, e in at.values()], default=0.0)
  timing = {s: SIDE_OVERHEAD_S if s in sides else 0.0 for s in ("torch", "ours")}
  for p in plans:
    if p["role"] == "profile":
      timing["ours"] += PROFILE_S
    elif p["side"] == "ours":
      timing["ours"] += PLAN_OVERHEAD_S + p["est_step_s"] * (warmup + steps * reps)
    else:
      timing["torch"] += p["est_step_s"] * steps * reps
  return {
    "at": at,
    "build_end_s": build_end,
    "timing_s": timing,
    "end_s": build_end + timing["torch"] + timing["ours"] + MARGIN_S,
  }


def admit(
  plans: Sequence[dict[str, Any]],
  deadline_s: float,
  steps: int,
  reps: int,
  warmup: int,
  compile_threads: int,
  smoke: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
  """(admitted, left out, the admitted run's `simulate`): plans taken in priority order while
  the simulated run still ends by the deadline (a profile only with its step, a peer variant
  only with the variant of ours it is the peer of)."""
  taken: list[dict[str, Any]] = []
  left: list[dict[str, Any]] = []
  for p in sorted(plans, key=lambda p: p["priority"]):
    needs = p.get("of") or p.get("with")  # a profile's step, a peer variant's partner
    if needs and not any(q["id"] == needs for q in taken):
      left.append(p)
      continue
    sim = simulate([*taken, p], steps, reps, warmup, compile_threads, smoke)
    (taken if sim["end_s"] <= deadline_s else left).append(p)
  return taken, left, simulate(taken, steps, reps, warmup, compile_threads, smoke)


def timing_reserve(sim: dict[str, Any]) -> float:
  """Seconds the timing phase needs after the builds (both sides, and the margin)."""
  return sim["end_s"] - sim["build_end_s"]


def describe(p: dict[str, Any]) -> str:
  """A plan in a few words: side, impl, task, shape, variant."""
  var = ",".join(f"{k}={v}" for k, v in p.get("variant", {}).items())
  what = "profile" if p["role"] == "profile" else p["impl"]
  return f"{p['side']} {what} {p['task']} {p['size']} {p['seq']} x {p['batch']} {var}".strip()


def format_plan(
  taken: Sequence[dict[str, Any]],
  left: Sequence[dict[str, Any]],
  sim: dict[str, Any],
  deadline_s: float,
) -> str:
  """The admitted plans with their simulated builds, what was left out, the phases' ends."""
  lines = [
    "| priority | plan | role | build s (est) | planned build start - end s | step ms (est) |",
    "|---|---|---|---|---|---|",
  ]
  for p in sorted(taken, key=lambda p: p["priority"]):
    start, end = sim["at"].get(p["id"], (None, None))
    when = f"{start:.0f} - {end:.0f}" if start is not None else "after the timing"
    lines.append(
      f"| {p['priority']} | {describe(p)} | {p['role']} | {p['est_compile_s']:.0f} | {when} | "
      f"{1e3 * p['est_step_s']:.0f} |"
    )
  for p in left:
    standby = p["side"] == "ours" and p["role"] == "variant"
    why = "on standby: built and timed only if time is left" if standby else "left out"
    lines.append(f"does not fit the deadline: {describe(p)} ({p['role']}) - {why}")
  t = sim["timing_s"]
  lines.append(
    f"builds end {sim['build_end_s']:.0f} s; timing: torch {t['torch']:.0f} s, ours "
    f"{t['ours']:.0f} s; planned end {sim['end_s']:.0f} s of the {deadline_s:.0f} s deadline"
  )
  return "\n".join(lines)
