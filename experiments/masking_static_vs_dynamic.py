"""Static vs dynamic masking (RoBERTa, Liu et al. 2019, Table 1).

Hypothesis: a fresh mask every epoch (dynamic) is as good as or slightly better than BERT's
static masks, and needs no duplicated data to see several masks per sequence.

Rows (`mode=`), changing only `config.masking.mode` from the BERT-Base recipe (MLM + NSP):
  static   BERT: mask = f(seed, example id); with the data duplicated dupe_factor=10 times
           each text is seen under 10 masks (RoBERTa's "static" baseline)
  dynamic  RoBERTa: mask = f(seed, example id, epoch), a new mask every pass
Both rows read the same data; eval always uses static masks so the numbers are comparable.

Downstream suite (`finetune_suite`, experiments/_downstream.py, the same for every point):
rotten_tomatoes, vitaminc, squadshifts, brown_pos (at cpu scale rotten_tomatoes and brown_pos
only: _downstream.tasks); at the reduced scales 1,500 training examples, 3 epochs at lr 1e-3,
3 seeds; at full scale the paper's recipe with 5 seeds.

Command (full scale):
  python launch/sweep.py --experiment=experiments/masking_static_vs_dynamic.py --root=$WD \
      --config.data.dir=$DATA/wiki_books_128
CPU scale (config_lib.scaled_base; the data of tools/replication/build_data.sh, which the
budget reads several times, so static shows each sequence one mask several times and dynamic
several masks; docs/replication.md):
  python launch/sweep.py \
      --experiment=experiments/masking_static_vs_dynamic.py:scale=cpu,data=$DATA \
      --root=/tmp/masking   # pretrain, fine-tune, report (in /tmp/masking/report)

Hardware and time: full scale, each point is a BERT-Base pretraining run (the paper's 4 Cloud
TPUs for 4 days). CPU scale, 2 CPU cores (AMD EPYC, no AVX-512), 2026-11-27: the dynamic
point 25.5 min beside another lane (about 13 alone, as Table 5's MLM + NSP point) and its
fine-tuning 5 min; the static row and the no-pretraining control are Table 5's, reused.

Result: not run at full scale here (no TPU). RoBERTa's Table 1 (BERT-Base size): static
SQuAD 2.0 F1 78.3, MNLI-m 84.3, SST-2 92.5; dynamic 78.7, 84.0, 92.9 ("comparable or
slightly better"). CPU scale (2026-11-27, 12,000 steps of 16 x 64 over 5 passes of the data;
test, 3 seeds; docs/replication.md): held-out MLM perplexity 46.7 static vs 38.7 dynamic
(accuracy 33.8% vs 34.9%, count-based reference 30.6%); static / dynamic: brown_pos
76.1 ± 0.3 / 76.6 ± 0.6, rotten_tomatoes 53.9 ± 3.1 / 51.4 ± 0.6 (no pretraining: 72.0 ± 0.1
and 52.8 ± 2.6): dynamic comparable downstream, better in pretraining.
"""

from bert_jax import config_lib

MODES = ("static", "dynamic")

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "masking"


def _parse(arg):
  return config_lib.parse_arg(arg, mode="static", scale="full", data="", seed=0, tasks="")


def get_config(arg=None):
  a = _parse(arg)
  if a.mode not in MODES:
    raise ValueError(f"mode must be one of {', '.join(MODES)}, not {a.mode!r}")
  c = config_lib.scaled_base(a.scale)
  c.masking.mode = a.mode  # the ablated field
  # At the reduced scales a point's budget reads the data several times (build_data.sh's 5
  # passes, read about 5 times by cpu's 12.3M tokens), so static masks come back and dynamic
  # ones do not.
  return config_lib.pretraining_seed(config_lib.use_data(c, a.data), a.seed)


def sweep(add, arg=None):
  # At the reduced scales the dynamic row is pretrained once (the budget goes to Table 5 and
  # 6): an observation, never a verdict. The static row is Table 5's baseline, every seed.
  full = _parse(arg).scale == "full"
  for seed in range(config_lib.PRETRAINING_SEEDS):
    for mode in MODES:
      if seed == 0 or full or mode == "static":
        add(mode=mode, seed=seed)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale, a.data)
  if a.mode == "static":  # the baseline also lends its architecture to the control rows
    runs += _downstream.control(a.scale, get_config(arg), a.seed, a.data)
  return _downstream.only(runs, a.tasks)
