"""Table 5 of BERT (Devlin et al. 2019): the effect of the pre-training tasks.

Hypothesis: the bidirectional masked LM is what makes BERT work; removing NSP costs a
little (QNLI 88.4 -> 84.9), and a left-to-right LM (GPT-style, no NSP) costs more on
downstream tasks.

Rows (`task=`), each changing only `config.objective` from the base recipe, all reading the
same sentence pairs when data= is given (without it, a row without NSP builds packed sentences
from data.input, so the data changes too):
  mlm_nsp  BERT-Base: masked LM + next sentence prediction (the baseline)
  mlm      "No NSP": masked LM only
  ltr      "LTR & No NSP": left-to-right LM (causal attention, next-token loss), no NSP
The paper's "+ BiLSTM" row is not a pretraining point: it is the ltr checkpoint fine-tuned with
a randomly initialised BiLSTM between encoder and head (`head.bilstm=True`), reported as the
row `task=ltr_bilstm,seed=S` (its runs are in <root>/task=ltr_bilstm,seed=S/finetune/). Every
row is pretrained with config_lib.PRETRAINING_SEEDS seeds (`seed=`); the downstream suite is
experiments/_downstream.py's, with the no-pretraining control beside the baseline.

Command (full scale; data=DIR holds DIR/nsp, a create_data output):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:data=$DATA \
      --root=$WD
CPU scale (tools/replication/replicate_cpu.sh runs it with every other experiment):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:scale=cpu,data=$DATA \
      --root=/tmp/table5   # pretrain, fine-tune, report (in /tmp/table5/report)

Hardware and time: full scale, each point is a BERT-Base-sized pretraining run (the paper's 4
Cloud TPUs for 4 days). CPU scale: the 2-core VM of docs/replication.md, where a tiny MLM
point takes 13 to 20 minutes; the whole replication's wall time is measured there.

Result: not run at full scale here (no TPU). The paper (dev sets, BERT-Base): MNLI-m
84.4 / 83.9 / 82.1, QNLI 88.4 / 84.9 / 84.3, SQuAD F1 88.5 / 87.9 / 77.8 for mlm_nsp / mlm /
ltr. Expected at cpu scale: every MLM run above its count-based reference on held-out masked
tokens. The reduced scales' numbers and verdicts: docs/replication.md.
"""

import os

from bert_jax import config_lib

TASKS = ("mlm_nsp", "mlm", "ltr")

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "table5"


def _parse(arg):
  return config_lib.parse_arg(arg, task="mlm_nsp", scale="full", data="", seed=0, tasks="", seeds=0)


def get_config(arg=None):
  a = _parse(arg)
  if a.task not in TASKS:
    raise ValueError(f"task must be one of {', '.join(TASKS)}, not {a.task!r}")
  c = config_lib.scaled_base(a.scale)
  # The ablated fields.
  c.objective.mlm = a.task != "ltr"
  c.objective.ltr = a.task == "ltr"
  c.objective.nsp = a.task == "mlm_nsp"
  c = config_lib.use_data(c, a.data)
  if a.data:
    # Every row reads the same sentence pairs (DIR/nsp): only the objective changes between
    # rows. (Without data=, a row without NSP builds packed sentences from data.input.)
    c.data.dir = os.path.join(a.data, "nsp")
  return config_lib.pretraining_seed(c, a.seed)


def sweep(add, arg=None):
  # Seed by seed (`seeds=N`: the first N, default config_lib.PRETRAINING_SEEDS).
  for seed in range(_parse(arg).seeds or config_lib.PRETRAINING_SEEDS):
    for task in TASKS:
      add(task=task, seed=seed)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale, a.data)
  if a.task == "mlm_nsp":  # the baseline also lends its architecture to the control rows
    runs += _downstream.control(a.scale, get_config(arg), a.seed, a.data)
  if a.task == "ltr" and "squad_split" in _downstream.tasks(a.scale):
    # "LTR & No NSP + BiLSTM": the same checkpoint, no second pretraining. Its claim is about
    # SQuAD, which the cpu suite leaves out (docs/replication.md: what was cut).
    row = {"task": "ltr_bilstm", "seed": a.seed}
    runs += [
      {**r, "overrides": {**r["overrides"], "head.bilstm": True}, "row": row} for r in list(runs)
    ]
  return _downstream.only(runs, a.tasks)
