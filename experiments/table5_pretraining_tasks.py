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
The paper's "+ BiLSTM" row (a BiLSTM on top of the LTR model for fine-tuning) is not
implemented.

Command (full scale, BERT-Base recipe of config_lib.base_config; NSP rows need NSP data,
the others packed data):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py --root=$WD \
      --only=task=mlm_nsp --config.data.dir=$DATA/wiki_books_128
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py --root=$WD \
      --only=task=mlm --config.data.dir=$DATA/wiki_books_128_packed   # likewise task=ltr
CPU scale (tiny model, bundled corpus, 300 steps; each run builds its own data):
  python launch/sweep.py --experiment=experiments/table5_pretraining_tasks.py:scale=cpu \
      --root=/tmp/table5 && python -m bert_jax.report --root=/tmp/table5

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


def get_config(arg=None):
  a = config_lib.parse_arg(arg, task="mlm_nsp", scale="full")
  if a.task not in TASKS:
    raise ValueError(f"task must be one of {', '.join(TASKS)}, not {a.task!r}")
  c = config_lib.scaled_base(a.scale)
  # The ablated fields.
  c.objective.mlm = a.task != "ltr"
  c.objective.ltr = a.task == "ltr"
  c.objective.nsp = a.task == "mlm_nsp"
  return c


def sweep(add):
  for task in TASKS:
    add(task=task)
