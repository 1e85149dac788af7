"""Static vs dynamic masking (RoBERTa, Liu et al. 2019, Table 1).

Hypothesis: a fresh mask every epoch (dynamic) is as good as or slightly better than BERT's
static masks, and needs no duplicated data to see several masks per sequence.

Rows (`mode=`), changing only `config.masking.mode` from the BERT-Base recipe (MLM + NSP):
  static   BERT: mask = f(seed, example id); with the data duplicated dupe_factor=10 times
           each text is seen under 10 masks (RoBERTa's "static" baseline)
  dynamic  RoBERTa: mask = f(seed, example id, epoch), a new mask every pass
Both rows read the same data; eval always uses static masks so the numbers are comparable.

Command (full scale):
  python launch/sweep.py --experiment=experiments/masking_static_vs_dynamic.py --root=$WD \
      --config.data.dir=$DATA/wiki_books_128
CPU scale (bundled corpus with dupe_factor 5, 300 steps: several epochs, so the masks differ):
  python launch/sweep.py --experiment=experiments/masking_static_vs_dynamic.py:scale=cpu \
      --root=/tmp/masking && python -m bert_jax.report --root=/tmp/masking

Result: not run at full scale here (no TPU). RoBERTa's Table 1 (BERT-Base size): static
SQuAD 2.0 F1 78.3, MNLI-m 84.3, SST-2 92.5; dynamic 78.7, 84.0, 92.9 ("comparable or
slightly better"). CPU scale: not yet run.
"""

import os

import bert_jax
from bert_jax import config_lib

MODES = ("static", "dynamic")
_CORPUS = os.path.join(os.path.dirname(bert_jax.__file__), "data", "sample_public_domain.txt")


def get_config(arg=None):
  a = config_lib.parse_arg(arg, mode="static", scale="full")
  if a.mode not in MODES:
    raise ValueError(f"mode must be one of {', '.join(MODES)}, not {a.mode!r}")
  c = _scaled_base(a.scale)
  c.masking.mode = a.mode  # the ablated field
  return c


def sweep(add):
  for mode in MODES:
    add(mode=mode)


def _scaled_base(scale):
  """Full: BERT-Base's recipe. CPU: a tiny model on the bundled corpus."""
  if scale == "full":
    return config_lib.base_config("base")
  if scale != "cpu":
    raise ValueError(f"scale must be full or cpu, not {scale!r}")
  c = config_lib.base_config("tiny")
  c.data.input = _CORPUS
  c.data.dupe_factor = 5
  c.data.eval_fraction = 0.05
  c.data.batch_size = 32
  c.opt.lr = 1e-3
  c.opt.total_steps = 300
  c.opt.warmup_steps = 30
  c.ckpt.every_steps = 300
  c.eval.every_steps = 100
  c.log.every_steps = 10
  return c
