"""Table 5 of BERT (Devlin et al. 2019): the effect of the pre-training tasks.

Hypothesis: the bidirectional masked LM is what makes BERT work; removing NSP costs a
little, and a left-to-right LM (GPT-style, no NSP) costs a lot more on downstream tasks.
Here we compare the pretraining metrics the rows can share (final train loss, eval
accuracy/perplexity of the LM objective, NSP accuracy where present); MLM and LTR accuracies
are different tasks and are not directly comparable, which is why the paper fine-tunes.

Rows (`task=`), each changing only `config.objective` from the base recipe:
  mlm_nsp  BERT-Base: masked LM + next sentence prediction (the baseline)
  mlm      "No NSP": masked LM only; the data is packed full sentences (create_data with NSP
           off, RoBERTa's FULL-SENTENCES), built automatically from `data.input` or given
           as --config.data.dir
  ltr      "LTR & No NSP": left-to-right LM (causal attention, next-token loss), no NSP
The paper's "+ BiLSTM" row is not a pretraining point: it is the ltr checkpoint fine-tuned with
a randomly initialised BiLSTM between encoder and head (`head.bilstm=True`), reported as the
row `task=ltr_bilstm` (its runs are in <root>/task=ltr_bilstm/finetune/).

Downstream suite (`finetune_suite`, experiments/_downstream.py, the same for every point):
rotten_tomatoes, vitaminc, squadshifts, brown_pos (at cpu scale rotten_tomatoes and brown_pos
only: _downstream.tasks, and squadshifts for the ltr and ltr_bilstm rows, whose claim is about
SQuAD); at the reduced scales 1,500 training examples, 3 epochs at lr 1e-3, 3 seeds; at full
scale the paper's recipe with 5 seeds.

Command (full scale, BERT-Base recipe of config_lib.base_config; data=DIR holds DIR/nsp and
DIR/packed, two create_data outputs of one corpus, and each row reads the one it needs):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:data=$DATA \
      --root=$WD
CPU scale (tiny model, config_lib.scaled_base; tools/replication/build_data.sh's data;
without data= each run builds the bundled corpus itself):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:scale=cpu,data=$DATA \
      --root=/tmp/table5   # pretrain, fine-tune, report (in /tmp/table5/report)

Hardware and time: full scale, each point is a BERT-Base pretraining run (the paper's 4 Cloud
TPUs for 4 days). CPU scale, 2 CPU cores (AMD EPYC, no AVX-512), 2026-11-27: an MLM point
13 to 15 min alone (12.3M tokens at 14,000 to 17,000 tokens/s), LTR about 35 (6,100 tokens/s:
its loss covers every position); each point's fine-tuning 3 to 5 min, the ltr rows'
squadshifts about 13 more each alone (the ltr row's took 32, niced beside two lanes).

Result: not run at full scale here (no TPU). The paper (dev sets, BERT-Base):
MNLI-m 84.4 / 83.9 / 82.1, SQuAD F1 88.5 / 87.9 / 77.8 for mlm_nsp / mlm / ltr.
CPU scale (2026-11-27, 12,000 steps of 16 x 64; test, 3 seeds; docs/replication.md): held-out
MLM accuracy 33.8% for mlm_nsp and mlm (count-based reference 30.6% / 30.7%); rotten_tomatoes
53.9 ± 3.1 / 57.5 ± 2.5 / 53.9 ± 3.0 / 52.5 ± 1.7 for mlm_nsp / mlm / ltr / ltr_bilstm (no
pretraining: 52.8 ± 2.6), brown_pos 76.1 ± 0.3 / 77.3 ± 0.2 / 73.9 ± 0.2 / 59.7 ± 1.7 (no
pretraining: 72.0 ± 0.1), squadshifts F1 9.5 ± 0.6 / 10.5 ± 0.9 for ltr / ltr_bilstm (the
BiLSTM's +1.0 just past the spread, where no point answers questions). MLM beats LTR on both
tasks (LTR overfits the 0.5M-token corpus: held-out next-token accuracy 19.1%, below its
count-based reference's 21.1%); NSP does not help (mlm beats mlm_nsp on both).
"""

import os

from bert_jax import config_lib

TASKS = ("mlm_nsp", "mlm", "ltr")

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "table5"


def _parse(arg):
  return config_lib.parse_arg(arg, task="mlm_nsp", scale="full", data="", seed=0, tasks="")


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


def sweep(add):
  # Seed by seed, so that an interrupted sweep has whole comparisons first.
  for seed in range(config_lib.PRETRAINING_SEEDS):
    for task in TASKS:
      add(task=task, seed=seed)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale, a.data)
  if a.task == "mlm_nsp":  # the baseline also lends its architecture to the control rows
    runs += _downstream.control(a.scale, get_config(arg), a.seed, a.data)
  if a.task == "ltr":
    # The BiLSTM's claim is about SQuAD: where the suite leaves it out (cpu), the ltr row
    # still fine-tunes it, and the BiLSTM row runs it alone.
    squad = "squad_split"
    if squad not in _downstream.tasks(a.scale):
      runs.append(_downstream.run(a.scale, squad, a.data))
    # "LTR & No NSP + BiLSTM": the same checkpoint, no second pretraining.
    row = {"task": "ltr_bilstm", "seed": a.seed}
    runs += [
      {**r, "overrides": {**r["overrides"], "head.bilstm": True}, "row": row}
      for r in list(runs)
      if a.scale != "cpu" or r["task"] == squad
    ]
  return _downstream.only(runs, a.tasks)
