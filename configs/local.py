"""The bundled default: a small BERT pretrained on the corpus shipped inside the package.

  python -m bert_jax.main --config=configs/local.py --workdir=/tmp/bert_local

Builds its data from bert_jax/data/sample_public_domain.txt (Alice in Wonderland and three
State of the Union addresses, 400 KB) with the BERT uncased vocab on first use, then trains
MLM+NSP on 2 CPU cores. Time and accuracy: see the README (measured).

ARG: `size=NAME` (default mini) and `steps=N`.
"""

from bert_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, size="mini", steps=400)
  c = config_lib.base_config(a.size)
  c.data.input = config_lib.BUNDLED_CORPUS
  c.data.max_seq_length = 128
  c.data.dupe_factor = 5
  c.data.eval_fraction = 0.05
  c.data.batch_size = 32
  c.masking.mode = "dynamic"
  c.opt.lr = 1e-3
  c.opt.total_steps = a.steps
  c.opt.warmup_steps = max(1, a.steps // 10)
  c.ckpt.every_steps = 200
  c.eval.every_steps = 200
  c.log.every_steps = 20
  c.log.fill_mask = (
    "alice was beginning to get very [MASK] of sitting by her sister on the bank .",
    "the white [MASK] ran close by her .",
    "the president of the united [MASK] addressed the congress .",
  )
  return c
