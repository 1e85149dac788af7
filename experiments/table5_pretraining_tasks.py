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
TPUs for 4 days). CPU scale (the old recipe), 2 CPU cores (AMD EPYC, AVX512-BF16): 45 min
for the three pretrainings (MLM 2.4 min, LTR 12 min: its loss covers every position) and 16
fine-tuning runs of 3 seeds.

Result: not run at full scale here (no TPU). The paper (dev sets, BERT-Base):
MNLI-m 84.4 / 83.9 / 82.1, SQuAD F1 88.5 / 87.9 / 77.8 for mlm_nsp / mlm / ltr.
CPU scale, the old recipe (2026-11-24, 300 steps of 32 x 128; test, 3 seeds;
docs/replication.md): rotten_tomatoes 65.5 ± 1.0 / 50.8 ± 0.0 / 64.3 ± 1.6 / 62.9 ± 2.5 for mlm_nsp
/ mlm / ltr / ltr_bilstm, brown_pos 78.6 / 78.8 / 80.5 / 58.0, squadshifts F1 8.6 / 9.4 / 9.0 /
9.9, vitaminc at the majority class (50.2) everywhere. LTR is not worse than MLM at this budget:
its objective trains every position and it learns more in 300 steps (held-out accuracy 12.3% vs
MLM's 7.5%).
"""

from bert_jax import config_lib

TASKS = ("mlm_nsp", "mlm", "ltr")

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "table5"


def _parse(arg):
  return config_lib.parse_arg(arg, task="mlm_nsp", scale="full", data="")


def get_config(arg=None):
  a = _parse(arg)
  if a.task not in TASKS:
    raise ValueError(f"task must be one of {', '.join(TASKS)}, not {a.task!r}")
  c = config_lib.scaled_base(a.scale)
  # The ablated fields.
  c.objective.mlm = a.task != "ltr"
  c.objective.ltr = a.task == "ltr"
  c.objective.nsp = a.task == "mlm_nsp"
  return config_lib.use_data(c, a.data)


def sweep(add):
  for task in TASKS:
    add(task=task)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale)
  if a.task == "mlm_nsp":  # the baseline also lends its architecture to the control row
    runs += _downstream.control(a.scale, get_config(arg))
  if a.task == "ltr":
    # The BiLSTM's claim is about SQuAD: where the suite leaves it out (cpu), these two rows
    # still fine-tune it.
    if "squadshifts" not in _downstream.tasks(a.scale):
      runs.append(_downstream.run(a.scale, "squadshifts"))
    # "LTR & No NSP + BiLSTM": the same checkpoint, no second pretraining.
    runs += [
      {**r, "overrides": {**r["overrides"], "head.bilstm": True}, "row": {"task": "ltr_bilstm"}}
      for r in list(runs)
    ]
  return runs
