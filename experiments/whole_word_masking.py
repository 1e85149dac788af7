"""Whole-word masking (the BERT repository's 2019 update; Cui et al. 2019 for Chinese).

Hypothesis: masking every WordPiece of a chosen word, instead of pieces independently, makes
the MLM task harder (no "##mon" given "phil ##am") and improves downstream accuracy. The
BERT README's BERT-Large (uncased) table: SQuAD 1.1 F1 91.0 -> 92.8, MultiNLI 86.05 -> 87.07.

Rows (`whole_word=`), changing only `config.masking.whole_word` from the BERT-Base recipe:
  False  pieces are masked independently (the original BERT)
  True   whole words are masked (still ~15% of tokens, max_predictions per sequence)
Eval uses each run's own masking, so its MLM accuracy is expected to be lower with whole
words (a harder task); compare the rows by fine-tuning. At the reduced scales the pieces row is
Table 5's baseline (every seed); the whole-word row is pretrained with every seed at cpu scale,
once at gpu scale (an observation, never a verdict).

Command (full scale; data=DIR holds DIR/nsp, a create_data output):
  python launch/sweep.py --experiment=experiments/whole_word_masking.py:data=$DATA --root=$WD
CPU scale (tools/replication/replicate_cpu.sh runs it with every other experiment):
  python launch/sweep.py --experiment=experiments/whole_word_masking.py:scale=cpu,data=$DATA \
      --root=/tmp/wwm --reuse=/tmp/table5

Hardware and time: full scale, each point is a BERT-Base-sized pretraining run (the paper's 4
Cloud TPUs for 4 days). CPU scale: the 2-core VM of docs/replication.md, where a tiny MLM
point takes 13 to 20 minutes; the whole replication's wall time is measured there.

Result: not run at full scale here (no TPU). The BERT repository's table (BERT-Large): MNLI-m
86.05 -> 87.07, SQuAD 1.1 F1 91.0 -> 92.8 with whole-word masking. Expected at cpu scale: both
rows above their count-based references (whole words are harder to fill: the reference drops
too). Numbers and verdicts: docs/replication.md.
"""

from bert_jax import config_lib

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "wwm"


def _parse(arg):
  return config_lib.parse_arg(
    arg, whole_word=False, scale="full", data="", seed=0, tasks="", seeds=0
  )


def get_config(arg=None):
  a = _parse(arg)
  c = config_lib.scaled_base(a.scale)
  c.masking.whole_word = a.whole_word  # the ablated field
  return config_lib.pretraining_seed(config_lib.use_data(c, a.data), a.seed)


def sweep(add, arg=None):
  # At scale=gpu the whole-word row is pretrained once (its 9-minute calls go to Table 5 and
  # 6): an observation, never a verdict; at cpu and full scale every seed. The pieces row is
  # Table 5's baseline, every seed.
  every = _parse(arg).scale != "gpu"
  for seed in range(_parse(arg).seeds or config_lib.PRETRAINING_SEEDS):
    for whole_word in (False, True):
      if seed == 0 or every or not whole_word:
        add(whole_word=whole_word, seed=seed)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale, a.data)
  if not a.whole_word:  # the baseline also lends its architecture to the control rows
    runs += _downstream.control(a.scale, get_config(arg), a.seed, a.data)
  return _downstream.only(runs, a.tasks)
