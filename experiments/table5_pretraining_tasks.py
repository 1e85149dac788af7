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
rotten_tomatoes, vitaminc, squadshifts, brown_pos; at cpu scale 1,500 training examples,
3 epochs at lr 1e-3, 3 seeds; at full scale the paper's recipe with 5 seeds.

Command (full scale, BERT-Base recipe of config_lib.base_config; NSP rows need NSP data,
the others packed data):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py --root=$WD \
      --only=task=mlm_nsp --config.data.dir=$DATA/wiki_books_128
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py --root=$WD \
      --only=task=mlm --config.data.dir=$DATA/wiki_books_128_packed   # likewise task=ltr
CPU scale (tiny model, bundled corpus, 300 steps; each run builds its own data):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:scale=cpu \
      --root=/tmp/table5   # pretrain, fine-tune, report (in /tmp/table5/report)

Hardware and time: full scale, each point is a BERT-Base pretraining run (the paper's 4 Cloud
TPUs for 4 days); CPU scale, 2 CPU cores, not yet
timed on this version (issue #21 runs it with the downstream suite).

Result: not run at full scale here (no TPU). The paper (dev sets, BERT-Base):
MNLI-m 84.4 / 83.9 / 82.1, SQuAD F1 88.5 / 87.9 / 77.8 for mlm_nsp / mlm / ltr.
CPU scale: only the mlm_nsp row was measured, before the kernels split (docs/history.md: eval
MLM accuracy 0.085 after 300 steps); expect the rows to be indistinguishable at this scale
(300 steps are too short for NSP to learn).
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
  if a.task == "ltr":
    # "LTR & No NSP + BiLSTM": the same checkpoint, no second pretraining.
    runs += [
      {**r, "overrides": {**r["overrides"], "head.bilstm": True}, "row": {"task": "ltr_bilstm"}}
      for r in _downstream.suite(a.scale)
    ]
  return runs
