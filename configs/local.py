"""The bundled default: a small BERT pretrained on the corpus shipped inside the package.

  python -m bert_jax.main --config=configs/local.py --workdir=/tmp/bert_local

On first use it trains a 4,096-token WordPiece vocab on bert_jax/data/sample_public_domain.txt
(Alice in Wonderland, a novel and three State of the Union addresses, 400 KB) and packs it into
sequences of up to 64 tokens; then it trains BERT-tiny (2 layers, hidden 128) with MLM in
float32 on 2 CPU cores, evaluates on a held-out document and prints fill_mask results.
The model, masking and optimizer are BERT's; the scale is chosen for a 10-minute CPU run
(batch 8, 10k steps, lr 1e-3, a corpus-sized vocab), and the objective is the paper's "No NSP"
row (Table 5) with dynamic masking, as RoBERTa: on this 15-document corpus NSP memorises its
pairs (train accuracy 92%, held-out 50%) and held MLM back (10k steps, measured on one host:
held-out MLM accuracy 19-22% with NSP, 25-27% without). MLM+NSP is `--config.objective.nsp=True`.
float32, not bf16: on CPUs without AVX512-BF16 bf16 is emulated (on a Zen 3 this run did 26 vs
42 steps/s; `python -m bert_jax.benchmark --sizes=base`: 125 vs 153 tokens/s).
Time and accuracy (fresh clone to last line, set-up included): 3 min 25 s on a 2-core Zen 4
(session 9), 6-7 min on a 2-core Zen 3; held-out MLM accuracy 24-25% against 8.4% for the most
frequent target (README).

ARG: `size=NAME` (default tiny) and `steps=N` (default 10000).
"""

from bert_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, size="tiny", steps=10_000)
  c = config_lib.base_config(a.size)
  c.model.vocab_size = c.data.train_vocab_size = 4096
  c.model.dtype = "float32"
  c.objective.nsp = False  # FULL-SENTENCES packing (RoBERTa) when NSP is off
  c.data.input = config_lib.BUNDLED_CORPUS
  c.data.max_seq_length = 64
  c.masking.max_predictions = 10  # 15% of 64
  c.data.dupe_factor = 5
  c.data.eval_fraction = 0.05
  c.data.batch_size = 8
  c.masking.mode = "dynamic"
  c.opt.lr = 1e-3
  c.opt.total_steps = a.steps
  c.opt.warmup_steps = max(1, a.steps // 20)
  c.ckpt.every_steps = max(1, a.steps // 4)
  c.eval.every_steps = max(1, a.steps // 4)
  c.log.every_steps = max(1, a.steps // 40)
  c.log.fill_mask = (
    "alice was beginning to get very tired of sitting by her [MASK] on the bank .",
    "the king and [MASK] of hearts were seated on their throne .",
    "the president of the united [MASK] addressed the congress .",
  )
  return c
