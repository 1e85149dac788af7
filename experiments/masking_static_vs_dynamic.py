"""Static vs dynamic masking (RoBERTa, Liu et al. 2019, Table 1).

Hypothesis: a fresh mask every epoch (dynamic) is as good as or slightly better than BERT's
static masks, and needs no duplicated data to see several masks per sequence.

Rows (`mode=`), changing only `config.masking.mode` from the BERT-Base recipe (MLM + NSP):
  static   BERT: mask = f(seed, example id); with the data duplicated dupe_factor times each
           text is seen under that many masks (RoBERTa's "static" baseline)
  dynamic  RoBERTa: mask = f(seed, example id, epoch), a new mask every pass
Both rows read the same data; eval always uses static masks so the numbers are comparable.
At the reduced scales the static row is Table 5's baseline (every seed); the dynamic row is
pretrained with every seed at cpu scale, once at gpu scale (an observation, never a verdict).

Command (full scale):
  python launch/sweep.py --experiment=experiments/masking_static_vs_dynamic.py:data=$DATA \
      --root=$WD
CPU scale (tools/replication/replicate_cpu.sh runs it with every other experiment):
  python launch/sweep.py \
      --experiment=experiments/masking_static_vs_dynamic.py:scale=cpu,data=$DATA \
      --root=/tmp/masking --reuse=/tmp/table5

Hardware and time: full scale, each point is a BERT-Base-sized pretraining run (the paper's 4
Cloud TPUs for 4 days). CPU scale: the 2-core VM of docs/replication.md, where a tiny MLM
point takes 13 to 20 minutes; the whole replication's wall time is measured there.

Result: not run at full scale here (no TPU). RoBERTa's Table 1 (BERT-Base size): static
SQuAD 2.0 F1 78.3, MNLI-m 84.3, SST-2 92.5; dynamic 78.7, 84.0, 92.9 ("comparable or
slightly better"). Expected at cpu scale: both rows above the count-based reference on the
same static held-out masks. Numbers and verdicts: docs/replication.md.
"""

from bert_jax import config_lib

MODES = ("static", "dynamic")

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "masking"


def _parse(arg):
  return config_lib.parse_arg(arg, mode="static", scale="full", data="", seed=0, tasks="", seeds=0)


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
  # At scale=gpu the dynamic row is pretrained once (its 9-minute calls go to Table 5 and 6):
  # an observation, never a verdict; at cpu and full scale every seed. The static row is Table
  # 5's baseline, every seed.
  every = _parse(arg).scale != "gpu"
  for seed in range(_parse(arg).seeds or config_lib.PRETRAINING_SEEDS):
    for mode in MODES:
      if seed == 0 or every or mode == "static":
        add(mode=mode, seed=seed)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale, a.data)
  if a.mode == "static":  # the baseline also lends its architecture to the control rows
    runs += _downstream.control(a.scale, get_config(arg), a.seed, a.data)
  return _downstream.only(runs, a.tasks)
