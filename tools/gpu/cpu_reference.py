"""The first three losses of the GPU comparison's BERT-Base pretraining step (seq 128, batch 256,
bf16 compute, float32 params), computed on the CPU, and their comparison with a GPU run's.

The GPU run (`python -m bert_jax.benchmark --gpu`, docs/gpu.md) records the losses of its first
steps for each of our plans. The one compared is its Base 128 x 256 plan with the stock XLA ops
(`kernels=xla`), threefry dropout bits and the explicit attention: the default model where it
resolves so on the GPU, else the benchmark's `dropout_rng=threefry,attention_impl=explicit`
variant (the GPU's default before issue 44). The CPU reference takes the same fields
explicitly, so both sides draw the same dropout masks from the same initial state and
synthetic batch. The CPU takes the batch in 8 accumulated micro-batches
of 32 (`opt.grad_accum_steps`; the whole batch at once needs 42 GB here) with
`remat_policy=full`: the loss is still the whole batch's (normalised by its counts), but each
micro-batch draws its own dropout and masking bits, a difference far below bf16 tolerance at
initialisation, where every token's loss is near ln(vocab).

  python tools/gpu/cpu_reference.py --out=tools/gpu/cpu_losses.json   # here: 5 min, 10 GB
  python tools/gpu/cpu_reference.py --compare=gpu_out/gpu.jsonl       # after a GPU run

`--compare` prints both and passes when every loss agrees within `--rtol` (bf16 tolerance).
"""

import json
import os
import sys

from absl import app, flags

flags.DEFINE_string("out", "", "Compute the CPU losses and write them here (JSON).")
flags.DEFINE_string("compare", "", "A GPU run's gpu.jsonl: compare its losses with --reference.")
flags.DEFINE_string(
  "reference", os.path.join(os.path.dirname(__file__), "cpu_losses.json"), "The CPU losses."
)
flags.DEFINE_float("rtol", 1e-2, "Relative tolerance of the comparison (bf16 compute).")
FLAGS = flags.FLAGS

SHAPE = dict(size="base", seq=128, batch=256)
FIELDS = {"kernels": "xla", "dropout_rng": "threefry", "remat_policy": "full"}
GRAD_ACCUM_STEPS = 8
STEPS = 3


def compute() -> dict:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  from bert_jax.benchmark import step as step_lib

  config = step_lib.bench_config(
    SHAPE["size"], SHAPE["seq"], SHAPE["batch"], "bfloat16", dict(FIELDS)
  )
  config.opt.grad_accum_steps = GRAD_ACCUM_STEPS
  st = step_lib.build_step(config)
  _, losses = step_lib.run_steps(st, STEPS)
  return {
    **SHAPE,
    "fields": FIELDS,
    "grad_accum_steps": GRAD_ACCUM_STEPS,
    "losses": losses,
    "backend": jax.default_backend(),
    "jax": jax.__version__,
  }


def gpu_losses(path: str) -> tuple[str, list[float]]:
  """(which plan, its first losses): the GPU run's Base 128 x 256 pretraining plan whose model
  ran the reference's dropout bits (its `built` record says `dropout_rng` threefry and
  `kernels` xla; with attention dropout, the explicit attention draws them as the CPU's does):
  the default model where it resolves so, else the variant that asks for them
  (`dropout_rng=threefry,attention_impl=explicit`)."""
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]

  def base(r: dict) -> bool:
    return (
      r.get("side") == "ours"
      and r.get("task") == "pretrain"
      and (r.get("size"), r.get("seq"), r.get("batch")) == tuple(SHAPE.values())
    )

  same = {
    r["id"]
    for r in records
    if base(r)
    and r.get("kind") == "built"
    and r.get("dropout_rng") == FIELDS["dropout_rng"]
    and r.get("kernels") == FIELDS["kernels"]
    and str(r.get("attention", "explicit")).startswith("explicit")
    and set(r.get("variant", {})) <= {"dropout_rng", "attention_impl"}
  }
  steps = [r for r in records if base(r) and r.get("kind") == "step" and r["id"] in same]
  for r in sorted(steps, key=lambda r: bool(r.get("variant"))):  # the default first
    variant = ",".join(f"{k}={v}" for k, v in r["variant"].items()) or "default"
    return f"{r['id']} ({variant})", r["losses"][:STEPS]
  raise SystemExit(
    f"{path}: no timed step of our Base 128 x 256 pretraining plan with the reference's "
    f"dropout bits ({FIELDS['dropout_rng']}, explicit attention, kernels {FIELDS['kernels']})"
  )


def main(argv):
  del argv
  if FLAGS.out:
    ref = compute()
    with open(FLAGS.out, "w") as f:
      json.dump(ref, f, indent=2)
      f.write("\n")
    print(json.dumps(ref))
  if FLAGS.compare:
    with open(FLAGS.reference) as f:
      ref = json.load(f)["losses"]
    which, gpu = gpu_losses(FLAGS.compare)
    print(f"GPU plan: {which}")
    worst = max(abs(g - c) / abs(c) for g, c in zip(gpu, ref, strict=True))
    for i, (g, c) in enumerate(zip(gpu, ref, strict=True), 1):
      print(f"step {i}: GPU {g:.5f}  CPU {c:.5f}")
    ok = worst <= FLAGS.rtol
    print(f"largest relative difference {worst:.2e} ({'within' if ok else 'beyond'} {FLAGS.rtol})")
    sys.exit(0 if ok else 1)
  if not (FLAGS.out or FLAGS.compare):
    raise app.UsageError("give --out or --compare")


if __name__ == "__main__":
  app.run(main)
