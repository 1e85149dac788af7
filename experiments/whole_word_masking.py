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
rotten_tomatoes, vitaminc, squadshifts, brown_pos; at cpu scale 1,500 training examples,
3 epochs at lr 1e-3, 3 seeds; at full scale the paper's recipe with 5 seeds.

Command (full scale):
  python launch/sweep.py --experiment=experiments/whole_word_masking.py --root=$WD \
      --config.data.dir=$DATA/wiki_books_128
CPU scale (bundled corpus, 300 steps):
  python launch/sweep.py --experiment=experiments/whole_word_masking.py:scale=cpu \
      --root=/tmp/wwm   # pretrain, fine-tune, report (in /tmp/wwm/report)

Hardware and time: full scale, each point is a BERT-Base pretraining run (the paper's 4 Cloud
TPUs for 4 days); CPU scale, 2 CPU cores, not yet
timed on this version (issue #21 runs it with the downstream suite).

Result: not run at full scale here (no TPU). CPU scale: not yet run.
"""

from bert_jax import config_lib


# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "wwm"

def _parse(arg):
  return config_lib.parse_arg(arg, whole_word=False, scale="full", data="")


def get_config(arg=None):
  a = _parse(arg)
  c = config_lib.scaled_base(a.scale)
  c.masking.whole_word = a.whole_word  # the ablated field
  return config_lib.use_data(c, a.data)


def sweep(add):
  for whole_word in (False, True):
    add(whole_word=whole_word)


def finetune_suite(arg=None):
  from experiments import _downstream

  return _downstream.suite(_parse(arg).scale)
