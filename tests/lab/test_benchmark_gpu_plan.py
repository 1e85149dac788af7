"""bert_jax.benchmark.gpu_plan: the GPU comparison's plan (shapes, profiles alone, variants), the
H200 plan against its deadline, the build gate on a simulated clock."""

import pytest

from bert_jax.benchmark import (
  gpu,
  gpu_plan,
  suite,
)
from lab._benchmark import _device_run_limits, _plan


def test_gpu_plans_shapes_profiles_alone_and_variants():
  plans = gpu_plan.make_plans()
  ours = [p for p in plans if p["side"] == "ours" and p["role"] == "shape"]
  torch_plans = [p for p in plans if p["side"] == "torch" and p["role"] == "shape"]
  shapes = [gpu_plan.SHAPES[n] for n in gpu_plan.DEFAULT_SHAPES]
  assert [(p["task"], p["size"], p["seq"], p["batch"]) for p in ours] == shapes
  assert [(p["impl"], p["task"], p["size"], p["seq"], p["batch"]) for p in torch_plans] == [
    (impl, *shape) for impl in ("torch", "torch_compile") for shape in shapes
  ]
  for p in torch_plans:  # the peer's recipe: SDPA, bf16 autocast, clipping, dropout 0.1
    assert (p["attn"], p["dtype"], p["clip_norm"], p["dropout"], p["attention_dropout"]) == (
      "sdpa", "bfloat16", 1.0, 0.1, 0.1
    )  # fmt: skip
  # Large 128 x 256 is built alone on each side: ours, and torch.compile's (not eager's), with
  # the estimates of a build alone.
  alone = [p for p in plans if p.get("alone")]
  assert [(p["impl"], p["size"], p["seq"]) for p in alone] == [
    ("bert_jax", "large", 128), ("torch_compile", "large", 128)
  ]  # fmt: skip
  assert [p["est_compile_s"] for p in alone] == [
    gpu_plan.EST_BUILD_S["ours_alone"][("pretrain", "large", 128)],
    gpu_plan.EST_BUILD_S["compile_alone"][("pretrain", "large", 128)],
  ]
  # The profiles: ours and torch.compile's step at Base 128 and at Large 512, after the shapes.
  profs = [p for p in plans if p["role"] == "profile"]
  by_id = {p["id"]: p for p in plans}
  assert [(p["side"], by_id[p["of"]]["impl"], p["size"], p["seq"]) for p in profs] == [
    ("ours", "bert_jax", "base", 128), ("torch", "torch_compile", "base", 128),
    ("ours", "bert_jax", "large", 512), ("torch", "torch_compile", "large", 512),
  ]  # fmt: skip
  assert [p["priority"] for p in profs] == list(range(9, 13))
  variants = [p for p in plans if p["role"] == "variant"]
  assert [p["priority"] for p in plans] == list(range(len(plans)))
  assert len({p["id"] for p in plans}) == len(plans)
  # The first GPU default first (every run A/Bs it: the threefry dropout with the explicit
  # attention), the recomputed GELU at Large 512, Large 128 and Base, JAX's threefry kernel
  # (the compile times), XLA's LayerNorm (the previous default) at Base and Large; then XLA's
  # GEMM options; no variant of a model choice that left the model; the default model is
  # whatever `auto` resolves to.
  assert [(p["size"], p["seq"], p["variant"]) for p in variants[:9]] == [
    ("base", 128, {"dropout_rng": "threefry", "attention_impl": "explicit"}),
    ("large", 512, {"remat_policy": "gelu"}),
    ("large", 128, {"remat_policy": "gelu"}),
    ("base", 128, {"remat_policy": "gelu"}),
    ("base", 128, {"jax_threefry_gpu_kernel_lowering": True}),
    ("base", 128, {"kernels": "xla"}),
    ("large", 128, {"kernels": "xla"}),
    ("base", 128, {"xla_gpu_enable_triton_gemm": False}),
    ("base", 128, {"xla_gpu_enable_cublaslt": True}),
  ]
  # A build after the first of its model waits for that one's init instead of compiling its
  # own: Large 512 after the alone Large 128, Base's variants after Base; scanned layers are
  # another model (the first of theirs compiles its init).
  est, init = gpu_plan.EST_BUILD_S["ours"], gpu_plan.EST_INIT_S
  assert ours[0]["est_compile_s"] == est[("pretrain", "base", 128)]
  assert ours[2]["est_compile_s"] == est[("pretrain", "large", 512)] - init[("pretrain", "large")]
  assert variants[0]["est_compile_s"] == est[("pretrain", "base", 128)] - init[("pretrain", "base")]
  assert (variants[1]["seq"], variants[1]["batch"]) == (512, 64)
  assert (
    variants[6]["est_compile_s"] == est[("pretrain", "large", 128)] - init[("pretrain", "large")]
  )
  assert all(p["variant"] == {} for p in ours)
  removed = {("dropout_rng", "rbg"), ("dropout_rng", "hash_redraw"), ("kernels", "lowp")}
  assert not removed & {(k, v) for p in variants for k, v in p["variant"].items()}
  cudnn, peer = [p for p in variants if p["variant"].get("attention_dropout_prob") == 0]
  assert cudnn["variant"]["attention_impl"] == "cudnn" and peer["side"] == "torch"
  # The PyTorch peer at the same setting: attention dropout 0, hidden 0.1, torch.compile; it
  # is admitted only with the variant of ours listed before it.
  assert (peer["impl"], peer["attention_dropout"], peer["dropout"]) == ("torch_compile", 0.0, 0.1)
  assert peer["with"] == cudnn["id"]
  assert variants[-1]["size"] == "large" and variants[-1]["variant"] == {"scan_layers": True}
  # Scanned layers compile one body: a smaller estimate than the unrolled model's.
  assert variants[-1]["est_compile_s"] < gpu_plan.EST_BUILD_S["ours"][("pretrain", "large", 128)]
  # --variants= means none; --shapes picks the shapes; --profile= none; ours alone; no alone
  # build where its shape is not among --shapes.
  plans = gpu_plan.make_plans(variants=[], torch_modes=[], shapes=["large512"], profile=[])
  assert [(p["side"], p["role"], p["size"], p["seq"], p.get("alone")) for p in plans] == [
    ("ours", "shape", "large", 512, None)
  ]
  assert suite.parse_variants("") == []
  plans = gpu_plan.make_plans(variants=[{"task": "finetune", "seq": "64"}], torch_modes=[])
  assert (plans[-1]["task"], plans[-1]["seq"], plans[-1]["variant"]) == ("finetune", 64, {})
  # Eager only: its plan is the alone one on the PyTorch side, and the profiled one.
  plans = gpu_plan.make_plans(torch_modes=["eager"], variants=[], shapes=["large128"])
  assert [(p["side"], p["impl"]) for p in plans if p.get("alone")] == [
    ("ours", "bert_jax"), ("torch", "torch")
  ]  # fmt: skip
  assert gpu_plan.make_plans(variants=[], shapes=["base128"], alone="")[0].get("alone") is None
  with pytest.raises(ValueError, match="unknown size 'huge'"):
    gpu_plan.make_plans(variants=[{"size": "huge"}])
  with pytest.raises(ValueError, match="unknown mode 'jit'"):
    gpu_plan.make_plans(torch_modes=["jit"])
  with pytest.raises(ValueError, match="unknown shape 'base999'"):
    gpu_plan.make_plans(shapes=["base999"])
  with pytest.raises(ValueError, match="side=torch: scan_layers not one of"):
    gpu_plan.make_plans(variants=[{"side": "torch", "scan_layers": True}])
  with pytest.raises(ValueError, match="--compile_alone: 'large128' is not one of --shapes"):
    gpu_plan.make_plans(shapes=["base128"], alone="large128")


def test_the_h200_plan_fits_nine_minutes_and_takes_every_must_show():
  """tools/gpu/device_run.sh's plan on the H200 estimates: both alone builds first, every
  shape on both sides and the four profiles admitted, the variants fill what is left in their
  order (the old default first), and the command (the deadline, the parent's grace, the
  set-up around it) stays under 9 minutes."""
  deadline, timeout = _device_run_limits()
  assert deadline + gpu.GRACE_S + 5 <= timeout and timeout + 15 <= 9 * 60
  plans = gpu_plan.make_plans()
  taken, left, sim = gpu_plan.admit(plans, deadline, steps=10, reps=3, warmup=3, compile_threads=3)
  assert sim["end_s"] <= deadline
  assert all(p["role"] == "variant" for p in left)
  assert {p["id"] for p in plans if p["role"] != "variant"} <= {p["id"] for p in taken}
  admitted = [(p["size"], p["seq"], p["variant"]) for p in taken
              if p["role"] == "variant" and p["side"] == "ours"]  # fmt: skip
  assert admitted[:4] == [("base", 128, {"dropout_rng": "threefry", "attention_impl": "explicit"}),
                          ("large", 512, {"remat_policy": "gelu"}),
                          ("large", 128, {"remat_policy": "gelu"}),
                          ("base", 128, {"remat_policy": "gelu"})]  # fmt: skip
  # The alone builds, ours then torch.compile's, each before any other build starts.
  ours_alone, torch_alone = [sim["at"][p["id"]] for p in plans if p.get("alone")]
  assert ours_alone[1] <= torch_alone[0] and torch_alone[1] == sim["alone_end_s"]
  others = [sim["at"][p["id"]] for p in taken if p["role"] != "profile" and not p.get("alone")]
  assert min(start for start, _ in others) >= sim["alone_end_s"]
  # Then ours start with the longest build (Large 512, though it waits for the alone Large
  # 128's init; Base compiles its own), the variants after the shapes.
  order = gpu_plan.build_order(taken)
  assert [(p["size"], p["seq"]) for p in order[:2]] == [("large", 512), ("base", 128)]
  assert all(p["role"] == "variant" for p in order[2:])
  # A tight deadline leaves out variants, never a shape, and a profile only with its step.
  taken, left, _ = gpu_plan.admit(plans, 460, steps=10, reps=3, warmup=3, compile_threads=3)
  assert {p["role"] for p in left} <= {"variant", "profile"}
  assert [p["role"] for p in taken if p["side"] == "ours"][:3] == ["shape"] * 3
  taken, left, _ = gpu_plan.admit(plans, 0, steps=10, reps=3, warmup=3, compile_threads=3)
  assert taken == [] and len(left) == len(plans)


def _replay(gate, order, seconds, threads=2, t0=0.0, lower_s=1.0):
  """Our worker's build phase (`gpu_ours.build`) on a simulated clock: each plan waits for a
  free compile thread, asks the gate, is lowered on the main thread (`lower_s`) and compiled
  for `seconds[id]`. Returns ({id: (start, end)} of the builds started, [ids skipped])."""
  t, running, at, skipped = t0, {}, {}, []

  def finish_until(now):
    for pid, end in sorted(running.items(), key=lambda kv: kv[1]):
      if end <= now:
        gate.done(next(p for p in order if p["id"] == pid), end - at[pid][0])
        del running[pid]

  for plan in order:
    finish_until(t)
    if len(running) >= threads:
      t = max(t, min(running.values()))
      finish_until(t)
    if not gate.try_start(plan, t):
      skipped.append(plan["id"])
      continue
    start, t = t, t + lower_s
    running[plan["id"]] = t + seconds[plan["id"]]
    at[plan["id"]] = (start, running[plan["id"]])
  finish_until(float("inf"))
  return at, skipped


def _gate_plans():
  # Two shapes (est 50 s), three variants (est 40 s) and a short one (est 10 s), 10-step
  # timings of 0.1 s: each plan owes 2.5 + 0.1 * 33 = 5.8 s of timing.
  plans = [_plan(0, "shape", est=50.0), _plan(1, "shape", est=50.0)]
  plans += [_plan(i, "variant", est=40.0) for i in (2, 3, 4)] + [_plan(5, "variant", est=10.0)]
  for p in plans:
    p["est_step_s"] = 0.1
  return plans


def test_build_gate_starts_standby_variants_whenever_they_fit_on_a_simulated_clock():
  """The gate lets a variant start when, started now, its build and the timing owed by every
  plan built or building end by the deadline; the planned build phase is no wall: builds that
  run faster than estimated leave time that the variants on standby take, a variant that no
  longer fits is skipped while a shorter one after it still starts, and shapes always start."""
  plans = _gate_plans()
  owe = gpu_plan.PLAN_OVERHEAD_S + 0.1 * (3 + 10 * 3)
  assert owe == pytest.approx(5.8)

  def gate(end_by, fixed_s=20.0, wait_until=0.0):
    return gpu_plan.BuildGate(plans, end_by, fixed_s, wait_until, steps=10, reps=3, warmup=3)

  # As estimated (shapes 50 s, variants 40 s, 10 s): by 160 s two variants fit. The third
  # (40 s, from 102 s: 142 + 20 fixed + 5 plans owed) does not; the short one after it does.
  est = {p["id"]: p["est_compile_s"] for p in plans}
  at, skipped = _replay(gate(160.0), plans, est)
  assert sorted(at) == ["ours0", "ours1", "ours2", "ours3", "ours5"] and skipped == ["ours4"]
  assert at["ours2"][0] == 51.0 and at["ours3"][0] == 52.0  # as the shapes' threads free up
  end = max(e for _, e in at.values()) + 20.0 + owe * len(at)
  assert end <= 160.0
  # The same plans when every build takes half its estimate: the leftover time takes all the
  # variants (the scale of finished builds over their estimates stays 1: never below it).
  at, skipped = _replay(gate(160.0), plans, {k: v / 2 for k, v in est.items()})
  assert sorted(at) == [p["id"] for p in plans] and skipped == []
  # A shape running past its estimate scales every later estimate by its overrun so far: at
  # 93 s, when ours2's thread frees, ours0 has run 93 s of its 50: the 40 s variants no longer
  # fit 200 s (74 s from 93 s), the 10 s one does; finished at 101 s, it sets the scale.
  slow = {**est, "ours0": 100.0}
  g = gate(200.0)
  at, skipped = _replay(g, plans, slow)
  assert at["ours2"] == (52.0, 93.0) and skipped == ["ours3", "ours4"]
  assert at["ours5"][0] == 93.0
  assert g.scale == pytest.approx(101.0 / 50.0)  # lowering included
  # PyTorch's builds ending later hold the timing phase back: with them planned to end at
  # 150 s, nothing but the shapes fits 160 s.
  at, skipped = _replay(gate(160.0, wait_until=150.0), plans, est)
  assert sorted(at) == ["ours0", "ours1"] and skipped == ["ours2", "ours3", "ours4", "ours5"]
  # Past the deadline: shapes start all the same, never a variant.
  at, skipped = _replay(gate(0.0), plans, est)
  assert sorted(at) == ["ours0", "ours1"] and len(skipped) == 4
  # A build that fails is owed nothing: the next variant gets its share.
  g = gate(160.0)
  assert g.try_start(plans[2], 0.0) and g.owed["ours2"] == pytest.approx(owe)
  g.done(plans[2], None)
  assert "ours2" not in g.owed and not g.busy and g.scale == 1.0


def test_build_gate_counts_the_profile_of_a_built_shape_as_owed():
  plans = _gate_plans() + [dict(_plan(6, "profile"), of="ours0")]
  g = gpu_plan.BuildGate(plans, 1e9, 0.0, 0.0, steps=10, reps=3, warmup=3)
  g.owe(plans[0])  # built in the alone phase
  g.try_start(plans[1], 0.0)
  owe = gpu_plan.PLAN_OVERHEAD_S + 0.1 * 33
  assert g.owed == pytest.approx({"ours0": owe + gpu_plan.PROFILE_S["ours"], "ours1": owe})
  assert g.planned_end(plans[2], 10.0) == pytest.approx(50.0 + sum(g.owed.values()) + owe)


def test_the_previous_gpu_defaults_are_admitted_beside_the_default():
  """Issue 44 item 1: the default is the fused LayerNorm with hash + flash ('auto'); the H200
  plan of tools/gpu/device_run.sh admits (not on standby) the first GPU default beside it at
  Base (the threefry dropout with the explicit attention, whose losses are compared with the
  CPU's) and the recomputed GELU at Large 512, Large 128 and Base, each built before the
  deadline; JAX's threefry kernel (the programs' compile time) and XLA's LayerNorm wait on
  standby, in that order."""
  deadline, _ = _device_run_limits()
  plans = gpu_plan.make_plans()
  taken, left, sim = gpu_plan.admit(plans, deadline, steps=10, reps=3, warmup=3, compile_threads=3)
  for variant, shape in (
    ({"dropout_rng": "threefry", "attention_impl": "explicit"}, ("base", 128, 256)),
    ({"remat_policy": "gelu"}, ("large", 512, 64)),
    ({"remat_policy": "gelu"}, ("large", 128, 256)),
    ({"remat_policy": "gelu"}, ("base", 128, 256)),
  ):
    (plan,) = [
      p for p in taken if p["variant"] == variant and (p["size"], p["seq"], p["batch"]) == shape
    ]
    assert sim["at"][plan["id"]][1] < deadline
  assert [(p["size"], p["variant"]) for p in left][:3] == [
    ("base", {"jax_threefry_gpu_kernel_lowering": True}),
    ("base", {"kernels": "xla"}),
    ("large", {"kernels": "xla"}),
  ]
  # Its init is another program (the threefry kernel's calls): it compiles its own.
  (kernel,) = [p for p in left if "jax_threefry_gpu_kernel_lowering" in p["variant"]]
  (xla_ln,) = [p for p in left if p["variant"] == {"kernels": "xla"} and p["size"] == "base"]
  init_s = gpu_plan.EST_INIT_S[("pretrain", "base")]
  assert kernel["est_compile_s"] == xla_ln["est_compile_s"] + init_s


def test_builds_of_one_model_share_its_compiled_init():
  """`step.compile_step`: a second build of the same model (another dropout generator and
  attention: the same parameters) takes the first's compiled init, and its state equals the
  first's; a build of another model (another position table) compiles its own."""
  import jax
  import numpy as np

  from bert_jax.benchmark import step as step_lib

  def build(size, **fields):
    config = step_lib.bench_config(size, 32, 2, "float32", fields)
    return step_lib.compile_step(step_lib.prepare(config))

  first = build("tiny", dropout_rng="hash", attention_impl="explicit")
  second = build("tiny", dropout_rng="threefry")
  other = build("tiny", max_position_embeddings=64)
  assert (second.init_shared, other.init_shared) == (True, False)
  assert second.init is first.init
  for a, b in zip(jax.tree.leaves(first.state), jax.tree.leaves(second.state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
