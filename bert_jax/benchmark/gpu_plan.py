"""What the GPU comparison (`gpu.py`) runs, in which order, and what fits its deadline.

A plan is one step to build and time: ours (the trainer's step at a shape, or a variant of it:
model fields, or `xla_*` XLA options compiled into that executable only) or PyTorch's (eager or
torch.compile at a shape, or a peer variant: `side=torch,attention_dropout_prob=0`), or the
profile of one of them (ours by `jax.profiler`, torch.compile's by `torch.profiler`). Each
carries estimates of its build and step time, from the H200 runs of 2026-11-28
(docs/gpu-runs/2026-11-28-h200-a1cfd24/).

The run has four phases. Alone: our build of the `--compile_alone` shape (Large 128 x 256),
then torch.compile's of the same shape, each with nothing else compiling or running. Build:
our other builds `compile_threads` at a time (the longest first, lowering on the main thread)
beside PyTorch's, one after another. Then PyTorch's timing phase (its matmuls, its steps, the
profiles of its steps), then ours.

Admission (`admit`): in priority order (the shapes on both sides, then the profiles, then the
variants as listed), a plan is taken only if the whole run, simulated with the plans taken so
far, still ends before the deadline, so a variant never takes the place of a shape and what
does not fit is reported before anything runs; our variants left out wait on standby.
`format_plan` prints the simulated schedule (`--dry_run`). At run time `BuildGate` decides when
each of our builds may start: a shape always, a variant (admitted or on standby) whenever its
estimate still fits the deadline less the timing still owed.
"""

from __future__ import annotations

import threading
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
# The profiled shapes (`--profile`; those of them that are among the shapes) and the shape
# whose cold build is measured alone on each side (`--compile_alone`).
DEFAULT_PROFILES = ("base128", "large512")
SMOKE_PROFILES = ("tiny128",)
COMPILE_ALONE = "large128"
SMOKE_ALONE = "tiny64"

# The default variants, in priority order; each at the first shape unless it says otherwise
# (`size=`, `seq=`, `batch=`, `task=`). Ours without a variant is the trainer's default
# (whatever `auto` resolves to on the device), so: the model's first GPU default, timed beside
# it (the threefry dropout with the explicit attention, whose losses are compared with the
# CPU's); the GELU's derivative computed from its input in the backward (`layer_scan.
# recomputed_gelu`: its intermediates not kept) at Large 512 (issue 44's memory bar), at Large
# 128 (its speed and MFU bars) and at Base (11.3 GiB against 15.5 as `jax.checkpoint`, 0.97x);
# JAX's threefry kernel (the init's compile, the longer half of every build); XLA's
# LayerNorm, the previous default, at Base and at Large (the fused kernels were measured at
# Base only); XLA's GEMM options (issue 44: our bf16 GEMMs against PyTorch's); the explicit
# attention with the hash dropout (the fallback where the flash kernel does not apply);
# cuDNN's fused attention without attention dropout (PyTorch timed at that setting too);
# compile time against step time (no autotuning; scanned layers at Base and at Large).
VARIANTS = (
  "dropout_rng=threefry,attention_impl=explicit;"
  "size=large,seq=512,batch=64,remat_policy=gelu;"
  "size=large,remat_policy=gelu;"
  "remat_policy=gelu;"
  "jax_threefry_gpu_kernel_lowering=True;"
  "kernels=xla;"
  "size=large,kernels=xla;"
  "xla_gpu_enable_triton_gemm=False;"
  "xla_gpu_enable_cublaslt=True;"
  "dropout_rng=hash,attention_impl=explicit;"
  "attention_impl=cudnn,attention_dropout_prob=0;"
  "side=torch,attention_dropout_prob=0;"
  "xla_gpu_autotune_level=0;"
  "scan_layers=True;"
  "size=large,scan_layers=True"
)
SMOKE_VARIANTS = "hidden_dropout_prob=0.0;scan_layers=True"
# Peer-variant fields (HF BertConfig's dropouts) and keys.
TORCH_FIELDS = ("attention_dropout_prob", "hidden_dropout_prob")

# H200, 2026-11-28 (docs/gpu-runs/2026-11-28-h200-827b3cf: the step and the init compiled
# side by side), rounded up; keys (task, size, seq). "ours": lowering + the longer of the
# step's and the init's compiles, beside two more of ours and PyTorch's compiles (Base 59 s:
# 5.7 + max(37.6, 53.3); Large 512 with Large 128's init 82 s; Large 128 has not been built
# beside others at this commit). "ours_alone": Large 128 alone (85.2 s: 10.0 + max(62.7,
# 75.2)). "compile": torch.compile's first step (Base 33 s, Large 512 77 s; Large 128 49-60 s
# the lending before); "compile_alone": Large 128's alone (53.9 s; 48.7 the lending before).
# Fine-tuning has not run on a GPU.
EST_BUILD_S = {
  "ours": {
    ("pretrain", "base", 128): 70,
    ("pretrain", "large", 128): 110,
    ("pretrain", "large", 512): 110,
    ("finetune", "base", 128): 70,
  },
  "ours_alone": {("pretrain", "large", 128): 100},
  "compile": {
    ("pretrain", "base", 128): 40,
    ("pretrain", "large", 128): 60,
    ("pretrain", "large", 512): 90,
    ("finetune", "base", 128): 30,
  },
  "compile_alone": {("pretrain", "large", 128): 60},
}
# What a later build of the same model saves by waiting for the first one's init instead of
# compiling its own (`step.compiled_init`): the first's build less its step's lowering and
# compile (Base 59 - 43 s, Large 128 alone 85 - 73 s), rounded down. The variants' builds that
# waited: Base 36-50 s, Large 512 82 s.
EST_INIT_S = {("pretrain", "base"): 15, ("pretrain", "large"): 10}
# Step seconds, H200 2026-11-28 (the same run; ours 51.7, 152.2 and 180.8 ms),
# torch.compile's and eager's (the lending before).
EST_STEP_S = {
  "ours": {
    ("pretrain", "base", 128): 0.053,
    ("pretrain", "large", 128): 0.155,
    ("pretrain", "large", 512): 0.185,
    ("finetune", "base", 128): 0.03,
  },
  "compile": {
    ("pretrain", "base", 128): 0.065,
    ("pretrain", "large", 128): 0.167,
    ("pretrain", "large", 512): 0.192,
    ("finetune", "base", 128): 0.02,
  },
  "eager": {
    ("pretrain", "base", 128): 0.093,
    ("pretrain", "large", 128): 0.212,
    ("pretrain", "large", 512): 0.228,
    ("finetune", "base", 128): 0.039,
  },
}
EAGER_BUILD_S = 5  # the model on the device and its first steps (0.9-3.0 s on the H200)
# Scanned layers compile one layer body (Base 19 s against 78 on the H200, 17 against 60 on
# the H100) and step slower (Base 97 ms against 67); no autotuning compiles faster.
VARIANT_COMPILE_SCALE = (("scan_layers", True, 0.4), ("xla_gpu_autotune_level", 0, 0.8))
VARIANT_STEP_SCALE = (("scan_layers", True, 1.7),)
SMOKE_BUILD_S, SMOKE_STEP_S = 20.0, 0.05  # the CPU smoke run's (tiny)
# Around the phases, from the calls of 2026-11-28 that timed them (a1cfd24's call 1: PyTorch
# 30.7 s for 7 plans of 30 steps, ours 43 s for 8 plans and a profile; 827b3cf's: PyTorch
# 30.0 s for 6 plans and 2 profiles, ours 32.8 s for 6 plans and 2 profiles, a profile of
# ours 4.6-6.6 s, one of PyTorch's under 1 s): a worker's start
# (imports, the device, ours its matmul programs compiled), our lowering per plan (on the main
# thread), per timed plan of ours the state's init and the first call (1.7-2.2 s), each side's
# matmuls (one timed call, a chain of products) and its exit, a profile (trace 5.1 s, parse
# 1.3 s at Base; PyTorch's export and parse), the parent's margin.
START_S = {"ours": 12.0, "torch": 15.0}
LOWER_S_PER_LAYER = 0.35
PLAN_OVERHEAD_S = 2.5
SIDE_OVERHEAD_S = 4.0
PEAK_S = 4.0
PROFILE_S = {"ours": 8.0, "torch": 4.0}
MARGIN_S = 10.0


def shape_of(name: str) -> dict[str, Any]:
  """A shape name's task, size, seq and batch."""
  if name not in SHAPES:
    raise ValueError(f"--shapes: unknown shape {name!r}; choose from {', '.join(SHAPES)}")
  return dict(zip(SHAPE_KEYS, SHAPES[name], strict=True))


def shape_name(plan: dict[str, Any]) -> str:
  """A plan's shape as a short name for files ("base128", "large512", "ft_base128")."""
  return f"{'ft_' if plan['task'] == 'finetune' else ''}{plan['size']}{plan['seq']}"


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


def estimates(
  side: str, shape: dict[str, Any], variant: dict[str, Any], smoke: bool, alone: bool = False
):
  """(build seconds, step seconds) of a plan; `side` is "ours", "eager" or "compile"; `alone`:
  a build with nothing beside it (the `--compile_alone` shape)."""
  if smoke:
    return SMOKE_BUILD_S, SMOKE_STEP_S
  task, size, seq = shape["task"], shape["size"], shape["seq"]
  step_s = _lookup(EST_STEP_S[side], task, size, seq) * _scale(variant, VARIANT_STEP_SCALE)
  if side == "eager":
    return float(EAGER_BUILD_S), step_s
  table = EST_BUILD_S[side]
  if alone and (task, size, seq) in EST_BUILD_S[f"{side}_alone"]:
    table = EST_BUILD_S[f"{side}_alone"]
  build = _lookup(table, task, size, seq) * _scale(variant, VARIANT_COMPILE_SCALE)
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


def _share_inits(plans: list[dict[str, Any]], smoke: bool) -> None:
  """Our builds after the first of a model (the alone one first, then in priority order: the
  order builds start) compile no init of their own: their estimates lose `EST_INIT_S`."""
  seen = set()
  ours = [p for p in plans if p["side"] == "ours" and p["role"] != "profile"]
  for p in sorted(ours, key=lambda p: (not p.get("alone"), p["priority"])):
    # A `jax_*` option changes the init's program too (gpu_ours.jax_options): its own init.
    jax_opts = tuple(sorted((k, str(v)) for k, v in p["variant"].items() if k.startswith("jax_")))
    model = (p["task"], p["size"], str(p["variant"].get("scan_layers", False)).lower() == "true")
    model += jax_opts
    if model in seen and not smoke:
      p["est_compile_s"] -= EST_INIT_S.get(model[:2], 0)
    seen.add(model)


def make_plans(
  smoke: bool = False,
  variants: Sequence[dict[str, Any]] | None = None,
  torch_modes: Sequence[str] = ("eager", "compile"),
  shapes: Sequence[str] | None = None,
  profile: Sequence[str] | None = None,
  alone: str | None = None,
) -> list[dict[str, Any]]:
  """Every plan in priority order: our shapes, PyTorch's (eager, then torch.compile), the
  profiles (per `profile` shape, default `DEFAULT_PROFILES` among the shapes, else the first:
  ours, then PyTorch's step at that shape, torch.compile's where it runs), then the variants in
  the order given (default `VARIANTS`; [] for none; a `side=torch` variant is the peer of the
  variant of ours just before it). The `alone` shape's plan of ours and its torch.compile plan
  (eager where torch.compile does not run) carry `alone: True` (default `COMPILE_ALONE` where
  it is among the shapes; "" for none). Each plan has an id, its side, shape, variant,
  `priority` and `role` ("shape", "profile" or "variant") and its estimates."""
  names = list(shapes or (SMOKE_SHAPES if smoke else DEFAULT_SHAPES))
  shape_list = [shape_of(n) for n in names]
  for mode in torch_modes:
    if mode not in ("eager", "compile"):
      raise ValueError(f"--torch_modes: unknown mode {mode!r}; use eager, compile")
  if variants is None:
    variants = suite.parse_variants(SMOKE_VARIANTS if smoke else VARIANTS)
  if profile is None:
    profile = [n for n in (SMOKE_PROFILES if smoke else DEFAULT_PROFILES) if n in names]
    profile = profile or names[:1]
  profile = list(profile)
  for p in profile:
    if p not in names:
      raise ValueError(f"--profile: {p!r} is not one of --shapes ({', '.join(names)})")
  if alone is None:
    alone = SMOKE_ALONE if smoke else COMPILE_ALONE
    alone = alone if alone in names else ""
  elif alone and alone not in names:
    raise ValueError(f"--compile_alone: {alone!r} is not one of --shapes ({', '.join(names)})")
  plans: list[dict[str, Any]] = []

  def add(side: str, mode: str, shape: dict[str, Any], variant: dict[str, Any], role: str):
    est_build, est_step = estimates(mode, shape, variant, smoke)
    plan = {
      "id": f"{side}{sum(p['side'] == side and p['role'] != 'profile' for p in plans)}",
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
    return plan

  def at(name: str, side: str) -> list[dict[str, Any]]:
    """The shape plans of one side at shape `name`, torch.compile's before eager's."""
    want = shape_of(name)
    got = [p for p in plans if p["side"] == side and p["role"] == "shape"
           and want == {k: p[k] for k in SHAPE_KEYS}]  # fmt: skip
    return sorted(got, key=lambda p: p.get("mode") != "compile")

  for shape in shape_list:
    add("ours", "ours", shape, {}, "shape")
  for mode in torch_modes:
    for shape in shape_list:
      add("torch", mode, shape, {}, "shape")
  if alone:
    for side, mode in (("ours", "ours"), ("torch", None)):
      for p in at(alone, side)[:1]:
        mode = mode or p["mode"]
        p["alone"] = True
        p["est_compile_s"] = estimates(mode, p, {}, smoke, alone=True)[0]
  for name in profile:
    for side in ("ours", "torch"):
      for of in at(name, side)[:1]:
        plans.append(
          {"id": f"profile:{of['id']}", "side": side, "role": "profile", "priority": len(plans),
           "of": of["id"], **{k: of[k] for k in SHAPE_KEYS}, "impl": of["impl"], "variant": {},
           "est_compile_s": 0.0, "est_step_s": 0.0, "est_mem": of["est_mem"]}
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
        peer = add("torch", mode, shape, fields, "variant")
        # The peer of the variant of ours listed just before it: admitted only with it.
        partner = [q for q in plans if q["side"] == "ours" and q["role"] == "variant"]
        if partner and partner[-1]["priority"] == peer["priority"] - 1:
          peer["with"] = partner[-1]["id"]
    elif side == "ours":
      add("ours", "ours", shape, fields, "variant")
    else:
      raise ValueError(f"--variants side={side!r}: use ours or torch")
  _share_inits(plans, smoke)
  return plans


def _mem_key(shape: dict[str, Any]) -> int:
  """An order of the plans' step memory (activations ~ tokens x layers x hidden)."""
  f = sizes.size_fields(shape["size"])
  return shape["batch"] * shape["seq"] * f["num_layers"] * f["hidden_size"]


def lower_s(plan: dict[str, Any], smoke: bool) -> float:
  """Seconds our main thread spends lowering a plan (tracing holds the GIL)."""
  return 0.0 if smoke else LOWER_S_PER_LAYER * sizes.size_fields(plan["size"])["num_layers"]


def build_order(plans: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Our builds of the build phase in the order they start (the `alone` one is built before):
  the shapes longest first, then the variants by priority (so a late run drops the last
  variants, never a shape)."""
  ours = [p for p in plans if p["side"] == "ours" and p["role"] != "profile" and not p.get("alone")]
  shapes = sorted((p for p in ours if p["role"] == "shape"), key=lambda p: -p["est_compile_s"])
  return shapes + sorted((p for p in ours if p["role"] == "variant"), key=lambda p: p["priority"])


def timing_s(plan: dict[str, Any], steps: int, reps: int, warmup: int) -> float:
  """Seconds a built plan takes in its side's timing phase (a profile: `PROFILE_S`)."""
  if plan["role"] == "profile":
    return PROFILE_S[plan["side"]]
  if plan["side"] == "ours":
    return PLAN_OVERHEAD_S + plan["est_step_s"] * (warmup + steps * reps)
  return plan["est_step_s"] * steps * reps


def simulate(
  plans: Sequence[dict[str, Any]],
  steps: int,
  reps: int,
  warmup: int,
  compile_threads: int,
  smoke: bool = False,
) -> dict[str, Any]:
  """The planned run of `plans`: each build's start and end (s from the start), when the
  build phase ends (both sides, and each), each side's timing phase and the run's end."""
  at: dict[str, tuple[float, float]] = {}
  sides = {p["side"] for p in plans}
  t = max(START_S[s] for s in sides) if sides else 0.0
  for side in ("ours", "torch"):  # alone: ours, then PyTorch's
    for p in plans:
      if p["side"] == side and p.get("alone"):
        at[p["id"]] = (t, t + p["est_compile_s"] + (lower_s(p, smoke) if side == "ours" else 0))
        t = at[p["id"]][1]
  alone_end = t
  main = t
  slots = [t] * max(1, compile_threads)
  for p in build_order(plans):
    main += lower_s(p, smoke)
    i = min(range(len(slots)), key=slots.__getitem__)
    start = max(main, slots[i])
    slots[i] = start + p["est_compile_s"]
    at[p["id"]] = (start, slots[i])
  for p in plans:
    if p["side"] == "torch" and p["role"] != "profile" and not p.get("alone"):
      at[p["id"]] = (t, t + p["est_compile_s"])
      t += p["est_compile_s"]
  ends = {s: max([e for i, (_, e) in at.items() if _side(plans, i) == s], default=0.0)
          for s in ("ours", "torch")}  # fmt: skip
  build_end = max([alone_end, *ends.values()])
  timing = {s: SIDE_OVERHEAD_S + PEAK_S if s in sides else 0.0 for s in ("torch", "ours")}
  for p in plans:
    timing[p["side"]] += timing_s(p, steps, reps, warmup)
  return {
    "at": at,
    "alone_end_s": alone_end,
    "build_end_s": build_end,
    "side_build_end_s": ends,
    "timing_s": timing,
    "end_s": build_end + timing["torch"] + timing["ours"] + MARGIN_S,
  }


def _side(plans: Sequence[dict[str, Any]], plan_id: str) -> str:
  return next(p["side"] for p in plans if p["id"] == plan_id)


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


def gate_spec(sim: dict[str, Any], t0: float) -> dict[str, float]:
  """What our worker's `BuildGate` needs of the plan: when PyTorch's builds are planned to end
  (absolute time; the timing phase waits for them) and the seconds of timing owed besides our
  plans' own: PyTorch's timing phase, our side's overheads and profiles, the margin."""
  fixed = sim["timing_s"]["torch"] + SIDE_OVERHEAD_S + PEAK_S + MARGIN_S
  return {"wait_until": t0 + sim["side_build_end_s"]["torch"], "fixed_s": fixed}


class BuildGate:
  """When each of our builds in the build phase may start, by the clock it is given (the
  worker's `time.time()`, a test's simulated one).

  A shape always starts. A variant starts when, started now, its build would end in time for
  the timing still owed: max(now + its build, the ends of our builds in flight, PyTorch's
  planned build end) + the timing of every plan built or building (and its own, and the
  profiles of those) + the fixed part (`gate_spec`) must not pass `end_by`. Every build's
  estimate is scaled by the largest overrun seen so far: of the builds finished, and of those
  in flight past their estimate. Our admitted variants and those on standby alike: a variant
  whose estimate no longer fits is skipped, and one further down the list with a shorter build
  may still start."""

  def __init__(
    self,
    plans: Sequence[dict[str, Any]],
    end_by: float,
    fixed_s: float,
    wait_until: float,
    steps: int,
    reps: int,
    warmup: int,
  ):
    self.end_by, self.fixed_s, self.wait_until = end_by, fixed_s, wait_until
    self.steps, self.reps, self.warmup = steps, reps, warmup
    self.profiles = {p["of"]: p for p in plans if p["role"] == "profile" and p["side"] == "ours"}
    self.scale = 1.0  # the largest overrun of the builds finished
    self.owed: dict[str, float] = {}  # plan id -> its timing seconds, for builds started or done
    self.busy: dict[str, tuple[float, float]] = {}  # plan id -> (start, estimate), in flight
    self._lock = threading.Lock()

  def _owes(self, plan: dict[str, Any]) -> float:
    own = timing_s(plan, self.steps, self.reps, self.warmup)
    prof = self.profiles.get(plan["id"])
    return own + (timing_s(prof, self.steps, self.reps, self.warmup) if prof else 0.0)

  def scale_at(self, now: float) -> float:
    """The estimates' scale at `now`: the largest overrun so far, in flight or finished."""
    with self._lock:
      running = [(now - s) / e for s, e in self.busy.values() if e > 0]
      return max([self.scale, *running])

  def planned_end(self, plan: dict[str, Any], now: float) -> float:
    """The run's end if `plan` started building now (with what is owed already)."""
    scale = self.scale_at(now)
    with self._lock:
      ends = [now + plan["est_compile_s"] * scale, self.wait_until]
      ends += [s + e * scale for s, e in self.busy.values()]
      return max(ends) + self.fixed_s + sum(self.owed.values()) + self._owes(plan)

  def try_start(self, plan: dict[str, Any], now: float) -> bool:
    """Whether `plan` starts now (`planned_end` by `end_by`, or a shape); if so it is owed."""
    ok = plan["role"] == "shape" or self.planned_end(plan, now) <= self.end_by
    if ok:
      with self._lock:
        self.owed[plan["id"]] = self._owes(plan)
        self.busy[plan["id"]] = (now, plan["est_compile_s"])
    return ok

  def owe(self, plan: dict[str, Any]) -> None:
    """`plan` was built before this gate (the alone phase): its timing is owed."""
    with self._lock:
      self.owed[plan["id"]] = self._owes(plan)

  def done(self, plan: dict[str, Any], seconds: float | None) -> None:
    """`plan`'s build ended after `seconds` (None: it failed, and is owed nothing)."""
    with self._lock:
      self.busy.pop(plan["id"], None)
      if seconds is None:
        self.owed.pop(plan["id"], None)
      elif plan["est_compile_s"] > 0:
        self.scale = max(self.scale, seconds / plan["est_compile_s"])


def describe(p: dict[str, Any]) -> str:
  """A plan in a few words: side, impl, task, shape, variant."""
  var = ",".join(f"{k}={v}" for k, v in p.get("variant", {}).items())
  what = f"profile of {p['impl']}" if p["role"] == "profile" else p["impl"]
  alone = " (alone)" if p.get("alone") else ""
  return (
    f"{p['side']} {what} {p['task']} {p['size']} {p['seq']} x {p['batch']} {var}".strip() + alone
  )


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
    when = f"{start:.0f} - {end:.0f}" if start is not None else "in the timing phase"
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
    f"alone builds end {sim['alone_end_s']:.0f} s; builds end {sim['build_end_s']:.0f} s "
    f"(ours {sim['side_build_end_s']['ours']:.0f}, torch {sim['side_build_end_s']['torch']:.0f}); "
    f"timing: torch {t['torch']:.0f} s, ours {t['ours']:.0f} s; planned end "
    f"{sim['end_s']:.0f} s of the {deadline_s:.0f} s deadline"
  )
  return "\n".join(lines)
