"""A/B of our train step under two environments or model variants, in lockstep: two live
worker processes take turns (`bert_jax.benchmark.lockstep.lockstep_rounds`, one untimed settle
step per turn), so the host's drift falls on both sides alike. E.g. the kernels A/B:

  python tools/probes/lockstep_ab.py --layers=4 --rounds=6 --b='V_kernels=xla'

or an environment A/B (malloc tunables, XLA flags):

  python tools/probes/lockstep_ab.py --layers=4 --rounds=6 \
      --a='GLIBC_TUNABLES=glibc.malloc.hugetlb=1' \
      --b='GLIBC_TUNABLES=glibc.malloc.hugetlb=1;XLA_FLAGS=--xla_cpu_scheduler_type=...'

A side is ';'-separated KEY=VALUE items: environment variables, or `V_field=value` for a
model field (e.g. `V_kernels=xla`). Prints B's step time over A's, round by round. Two
checkouts, side by side (run it from a directory holding neither, so each worker imports the
bert_jax its PYTHONPATH names; REPO is this checkout):

  cd /tmp && python "$REPO"/tools/probes/lockstep_ab.py --size=tiny --layers=0 \
      --dtype=bfloat16 --a='PYTHONPATH=/path/to/the/old/checkout' --b=''

"""

import statistics

from absl import flags

from bert_jax import cli
from bert_jax.benchmark import lockstep, measure, suite

flags.DEFINE_string("size", "base", "Model size.")
flags.DEFINE_integer("layers", 4, "num_layers of both sides (0: the size's own).")
flags.DEFINE_integer("batch", 32, "Batch.")
flags.DEFINE_integer("seq", 128, "Sequence length.")
flags.DEFINE_string("dtype", "float32", "Compute dtype of both sides.")
flags.DEFINE_integer("rounds", 6, "Rounds of one turn each.")
flags.DEFINE_float("turn_s", 0.0, "A turn times whole steps this long (0: one step).")
flags.DEFINE_string("a", "", "Side A: KEY=VALUE;... (environment, or V_field=value).")
flags.DEFINE_string("b", "", "Side B, the same form.")
FLAGS = flags.FLAGS


def side(text: str) -> tuple[dict[str, str], dict]:
  env, variant = {}, {}
  for item in filter(None, text.split(";")):
    key, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--a/--b: {item!r} is not KEY=VALUE")
    if key.startswith("V_"):
      variant[key[2:]] = suite.parse_value(value)
    else:
      env[key] = value
  return env, variant


def main(argv: list[str]) -> None:
  del argv
  workers = []
  try:
    for name, text in (("A", FLAGS.a), ("B", FLAGS.b)):
      env, variant = side(text)
      if FLAGS.layers:
        variant = {"num_layers": FLAGS.layers, **variant}
      spec = dict(size=FLAGS.size, seq=FLAGS.seq, batch=FLAGS.batch, dtype=FLAGS.dtype, steps=0)
      spec.update(warmup=1, variant=variant, serve=True, peak=False)
      workers.append(lockstep.LockstepWorker(name, measure.ours_argv(spec), 3600, env=env))
    got = lockstep.lockstep_rounds(*workers, FLAGS.rounds, FLAGS.turn_s, settle_steps=1)
    recs = [w.finish() for w in workers]
  finally:
    for w in workers:
      w.close()
  per_step = {k: [t / n for n, t in got[f"{k}_turns"]] for k in ("a", "b")}
  ratios = [b / a for a, b in zip(per_step["a"], per_step["b"], strict=True)]
  for k, text, rec in (("a", FLAGS.a, recs[0]), ("b", FLAGS.b, recs[1])):
    print(
      f"{k.upper()} {text!r}: step s {[round(t, 2) for t in per_step[k]]}, "
      f"page faults/step {rec['page_faults_per_step']:.0f}, peak RSS {rec['peak_rss_gb']:.2f} GB"
    )
  print(
    f"B / A step time per round {[round(r, 3) for r in ratios]}: median "
    f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
  )


def run() -> None:
  cli.run(main, "lockstep_ab")


if __name__ == "__main__":
  run()
