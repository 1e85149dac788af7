"""BERT-Large pretraining (24 layers, hidden 1024, 16 heads; 336M params with the heads).

  python -m bert_jax.main --config=bert_large --workdir=$WD \
      --config.data.dir=$DATA/wiki_books_128
  python -m bert_jax.aot --config=bert_large --topology=v5e-16  # does it fit?

Same recipe as bert_base (ARG `phase=1|2`). Layers are scanned (compile time independent of
depth) and rematerialised at the dots-without-batch-dims policy.

Hardware: the paper's 16 Cloud TPUs (64 chips). Time: 4 days there. Expected: above
BERT-Base's pretraining accuracy (bert_jax has not run it end to end: no TPU has been
available). Fit on a v5e-16: docs/aot_fit.md.
"""

from bert_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, phase=1)
  c = config_lib.base_config("large")
  c.model.scan_layers = True
  c.model.remat_policy = "minimal"
  return config_lib.pretraining_phase(c, a.phase)
