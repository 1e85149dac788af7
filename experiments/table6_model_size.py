"""Table 6 of BERT (Devlin et al. 2019): the effect of model size.

Hypothesis: bigger is better, even on small downstream tasks: held-out MLM perplexity and
fine-tuned accuracy improve monotonically from 3 to 24 layers, 768 to 1024 hidden.

Rows (`row=`, the paper's #L/#H/#A; names from bert_jax.model_config.SIZES), each changing only
the model's depth, width and heads (intermediate = 4 x hidden) from the base recipe (at the
reduced scales also the lr, halved per doubling of width or depth: the recipe's lr was
chosen on tiny):
  L3_H768_A12, L6_H768_A3, L6_H768_A12, L12_H768_A12 (= BERT-Base), L12_H1024_A16,
  L24_H1024_A16 (= BERT-Large)
At `scale=gpu` the rows are depth {2, 4} x width {128, 256} at the same token budget
(config_lib.scaled_base's): tiny (2 layers, hidden 128), L4_H128_A2, L2_H256_A4 and mini
(4, 256), 0.4M to 3.1M non-embedding parameters (8x; the paper's rows span 14x). At
`scale=cpu` the first three (4x): mini alone would cost the 2-core replication about as much
as the rest of it.

Downstream suite (`finetune_suite`, experiments/_downstream.py, the same for every point):
rotten_tomatoes, vitaminc, squadshifts, brown_pos (at cpu scale rotten_tomatoes and brown_pos
only: _downstream.tasks); at the reduced scales 1,500 training examples, 3 epochs at lr 1e-3,
3 seeds; at full scale the paper's recipe with 5 seeds.

Command (full scale; the big rows may want --config.model.scan_layers=True, and
`python -m bert_jax.aot` tells whether a row fits a slice):
  python launch/sweep.py --experiment=experiments/table6_model_size.py --root=$WD \
      --config.data.dir=$DATA/wiki_books_128
CPU scale (config_lib.scaled_base; tools/replication/build_data.sh's data):
  python launch/sweep.py --experiment=experiments/table6_model_size.py:scale=cpu,data=$DATA \
      --root=/tmp/table6   # pretrain, fine-tune, report (in /tmp/table6/report)

Hardware and time: full scale, each point is a pretraining run of its size (BERT-Base: the
paper's 4 Cloud TPUs for 4 days). CPU scale, 2 CPU cores (AMD EPYC, no AVX-512), 2026-11-28:
L2_H256_A4 68 min and L4_H128_A2 about 47, each beside one or two other runs (a tiny point
takes 13 to 15 alone); fine-tuning 10 and 13 min; tiny and the control are Table 5's, reused.

Result: not run at full scale here (no TPU). The paper's held-out LM perplexity:
5.84, 5.24, 4.68, 3.99, 3.54, 3.23 for the six rows in order (MNLI-m 77.9 ... 86.6).
CPU scale (2026-11-27/28, 12,000 steps of 16 x 64, lr 1.4e-3 / 7e-4 / 7e-4; test, 3 seeds;
docs/replication.md): held-out MLM accuracy 33.8% / 32.5% / 35.8% for tiny / L4_H128_A2 /
L2_H256_A4 (count-based reference 30.6%), perplexity 46.7 / 58.3 / 41.4; brown_pos
76.1 ± 0.3 / 79.0 ± 0.2 / 82.4 ± 0.0, rotten_tomatoes 53.9 ± 3.1 / 53.5 ± 0.5 / 56.4 ± 0.7
(no pretraining: 72.0 ± 0.1 and 52.8 ± 2.6). Bigger is better on brown_pos, as in the paper;
perplexity falls with width, not yet with depth. At tiny's lr (1.4e-3) the 256-wide row
stayed on the unigram plateau (15.3%) and the 4-deep row left it late (31.1%):
docs/replication/budget.md section 5.
"""

from bert_jax import config_lib, model_config

# The published rows and claims the report puts beside ours (bert_jax.report --paper).
PAPER = "table6"

ROWS = (
  "L3_H768_A12",
  "L6_H768_A3",
  "L6_H768_A12",
  "L12_H768_A12",
  "L12_H1024_A16",
  "L24_H1024_A16",
)


# The reduced scales' rows, of bert_jax.model_config.SIZES: gpu, four sizes of 0.4M to 3.1M
# non-embedding parameters; cpu, the three that fit its 2-core budget (mini alone would take
# about as long as the rest of the cpu replication).
GPU_ROWS = ("tiny", "L4_H128_A2", "L2_H256_A4", "mini")
CPU_ROWS = GPU_ROWS[:3]


# The size the reduced scales' lr (config_lib.scaled_base) was chosen for: tiny's.
TINY_WIDTH, TINY_DEPTH = 128, 2


def _rows(scale: str) -> tuple[str, ...]:
  return {"full": ROWS, "gpu": GPU_ROWS}.get(scale, CPU_ROWS)


def _baseline(scale: str) -> str:
  """BERT-Base, or at the reduced scales the size scaled_base trains."""
  return "L12_H768_A12" if scale == "full" else "tiny"


def _parse(arg):
  return config_lib.parse_arg(arg, row="", scale="full", data="")


def get_config(arg=None):
  a = _parse(arg)
  c = config_lib.scaled_base(a.scale)
  a.row = a.row or _baseline(a.scale)
  if a.row not in _rows(a.scale):
    raise ValueError(f"row must be one of {', '.join(_rows(a.scale))}, not {a.row!r}")
  # The ablated fields.
  c.model.update(model_config.size_fields(a.row))
  if a.scale != "full":
    # The reduced scales' lr was chosen on tiny (2 x 128); a bigger row gets it halved per
    # doubling of width or depth. At 1.4e-3 the 256-wide row stayed on the unigram plateau
    # for the whole cpu budget and the 4-deep row left it after 6,000 steps; at 7e-4 both
    # left it sooner; so did mini at scale=gpu, at 3.5e-4 against 7e-4
    # (docs/replication/budget.md section 5).
    c.opt.lr *= (TINY_WIDTH / c.model.hidden_size) * (TINY_DEPTH / c.model.num_layers)
  return config_lib.use_data(c, a.data)


def sweep(add, arg=None):
  for row in _rows(_parse(arg).scale):
    add(row=row)


def finetune_suite(arg=None):
  from experiments import _downstream

  a = _parse(arg)
  runs = _downstream.suite(a.scale)
  if (a.row or _baseline(a.scale)) == _baseline(a.scale):
    # The baseline size also lends its architecture to the no-pretraining control row.
    runs += _downstream.control(a.scale, get_config(arg))
  return runs
