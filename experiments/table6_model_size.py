"""Table 6 of BERT (Devlin et al. 2019): the effect of model size.

Hypothesis: bigger is better, even on small downstream tasks: held-out MLM perplexity and
fine-tuned accuracy improve monotonically from 3 to 24 layers, 768 to 1024 hidden.

Rows (`row=`, the paper's #L/#H/#A; names from bert_jax.model.SIZES), each changing only
the model's depth, width and heads (intermediate = 4 x hidden) from the base recipe:
  L3_H768_A12, L6_H768_A3, L6_H768_A12, L12_H768_A12 (= BERT-Base), L12_H1024_A16,
  L24_H1024_A16 (= BERT-Large)
At `scale=cpu` each row is a scaled-down analogue with the same head count, a third of the
layers and an eighth of the width: L3_H768_A12 -> 1 layer, hidden 96, 12 heads; ...;
L24_H1024_A16 -> 8 layers, hidden 128, 16 heads (head dims 8 to 32, as the rows' ratios).

Command (full scale; the big rows may want --config.model.scan_layers=True, and
`python -m bert_jax.aot` tells whether a row fits a slice):
  python launch/sweep.py --experiment=experiments/table6_model_size.py --root=$WD \
      --config.data.dir=$DATA/wiki_books_128
CPU scale (bundled corpus, 300 steps):
  python launch/sweep.py --experiment=experiments/table6_model_size.py:scale=cpu \
      --root=/tmp/table6 && python -m bert_jax.report --root=/tmp/table6

Hardware and time: full scale, each point is a pretraining run of its size (BERT-Base: the
paper's 4 Cloud TPUs for 4 days); CPU scale, 2 CPU cores, not yet
timed on this version (issue #21 runs it with the downstream suite).

Result: not run at full scale here (no TPU). The paper's held-out LM perplexity:
5.84, 5.24, 4.68, 3.99, 3.54, 3.23 for the six rows in order (MNLI-m 77.9 ... 86.6).
CPU scale: not yet run.
"""

from bert_jax import config_lib

ROWS = (
  "L3_H768_A12",
  "L6_H768_A3",
  "L6_H768_A12",
  "L12_H768_A12",
  "L12_H1024_A16",
  "L24_H1024_A16",
)


def get_config(arg=None):
  a = config_lib.parse_arg(arg, row="L12_H768_A12", scale="full")
  if a.row not in ROWS:
    raise ValueError(f"row must be one of {', '.join(ROWS)}, not {a.row!r}")
  c = config_lib.scaled_base(a.scale)
  # The ablated fields.
  layers, hidden, heads = (int(p[1:]) for p in a.row.split("_"))
  if a.scale == "cpu":
    layers, hidden = layers // 3, hidden // 8
  c.model.num_layers = layers
  c.model.hidden_size = hidden
  c.model.num_heads = heads
  c.model.intermediate_size = 4 * hidden
  return c


def sweep(add):
  for row in ROWS:
    add(row=row)
