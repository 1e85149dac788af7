"""Whole-word masking (the BERT repository's 2019 update; Cui et al. 2019 for Chinese).

Hypothesis: masking every WordPiece of a chosen word, instead of pieces independently, makes
the MLM task harder (no "##mon" given "phil ##am") and improves downstream accuracy. The
BERT README's BERT-Large (uncased) table: SQuAD 1.1 F1 91.0 -> 92.8, MultiNLI 86.05 -> 87.07.

Rows (`whole_word=`), changing only `config.masking.whole_word` from the BERT-Base recipe:
  False  pieces are masked independently (the original BERT)
  True   whole words are masked (still ~15% of tokens, max_predictions per sequence)
Eval uses each run's own masking, so its MLM accuracy is expected to be lower with whole
words (a harder task); compare the rows by fine-tuning, or by eval loss at equal masking.

Downstream suite (`finetune_suite`, experiments/_downstream.py, the same for every point):
rotten_tomatoes, vitaminc, squadshifts, brown_pos (at cpu scale rotten_tomatoes and brown_pos
only: _downstream.tasks); at the reduced scales 1,500 training examples, 3 epochs at lr 1e-3,
3 seeds; at full scale the paper's recipe with 5 seeds.

Command (full scale; data=DIR holds DIR/nsp, a create_data output):
  python launch/sweep.py --experiment=experiments/whole_word_masking.py:data=$DATA --root=$WD
CPU scale (tiny model, config_lib.scaled_base; tools/replication/build_data.sh's data; the
pieces row is Table 5's mlm_nsp point, linked by --reuse):
  python launch/sweep.py --experiment=experiments/whole_word_masking.py:scale=cpu,data=$DATA \
      --root=/tmp/wwm --reuse=/tmp/table5   # pretrain, fine-tune, report (in /tmp/wwm/report)

Hardware and time: full scale, each point is a BERT-Base pretraining run (the paper's 4 Cloud
TPUs for 4 days). CPU scale, 2 CPU cores (AMD EPYC, no AVX-512), 2026-11-27: the whole-word
point 19 min (beside another lane's LTR point) and its fine-tuning 5 min; the pieces row and the
no-pretraining control are Table 5's, reused.

Result: not run at full scale here (no TPU). The BERT repository's table (BERT-Large): MNLI-m
86.05 -> 87.07, SQuAD 1.1 F1 91.0 -> 92.8 with whole-word masking.
CPU scale (2026-11-27, 12,000 steps of 16 x 64; test, 3 seeds; docs/replication.md): held-out
MLM accuracy on each point's own masks 33.8% pieces / 31.9% whole words (count-based reference
30.6% / 26.0%: whole words are harder to fill); brown_pos 76.1 ± 0.3 / 78.0 ± 0.4 (whole words
better beyond the spread), rotten_tomatoes 53.9 ± 3.1 / 54.6 ± 1.9 (no pretraining: 72.0 ± 0.1
and 52.8 ± 2.6).
"""

from bert_jax import config_lib

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "wwm"


def _parse(arg):
  return config_lib.parse_arg(arg, whole_word=False, scale="full", data="", seed=0, tasks="")


def get_config(arg=None):
  a = _parse(arg)
  c = config_lib.scaled_base(a.scale)
  c.masking.whole_word = a.whole_word  # the ablated field
  return config_lib.pretraining_seed(config_lib.use_data(c, a.data), a.seed)


def sweep(add, arg=None):
  # At the reduced scales the whole-word row is pretrained once (the budget goes to Table 5 and
  # 6): an observation, never a verdict. The pieces row is Table 5's baseline, every seed.
  full = _parse(arg).scale == "full"
  for seed in range(config_lib.PRETRAINING_SEEDS):
    for whole_word in (False, True):
      if seed == 0 or full or not whole_word:
        add(whole_word=whole_word, seed=seed)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale, a.data)
  if not a.whole_word:  # the baseline also lends its architecture to the control rows
    runs += _downstream.control(a.scale, get_config(arg), a.seed, a.data)
  return _downstream.only(runs, a.tasks)
