"""The bundled default: BERT-tiny pretrained with masked LM on the corpus shipped in the package.

  bert_jax_train --config=local --workdir=/tmp/bert_local
  python -m bert_jax.main --config=configs/local.py --workdir=/tmp/bert_local  # from a checkout

Hardware: 2 CPU cores; bfloat16 compute where the CPU has AVX512-BF16 or AMX (/proc/cpuinfo,
the benchmark's rule), float32 elsewhere (bf16 is emulated there, and slower). Time: 3 min 19 s
from a fresh clone to the last line, venv and pip install included, at 38 steps/s (2-core AMD
EPYC Zen 5 with AVX512-BF16 shared with other jobs, load 4-5, 2026-11-26; the previous default,
10k steps of batch 8 in float32, took 3 min 11 s there). Reaches held-out MLM accuracy 34.2%
(31.2% at [MASK], perplexity 52) after 6k steps, the same every run; on the same held-out masks
the count-based neighbour reference gets 31.0% (27.1%; `python references/ngram_reference.py
WORKDIR`) and always predicting the most frequent target 9.5%. The held-out split is one
document (451 masked targets, about +-2 points): over 10 mask draws of it the model averages
35.9% and the reference 31.0%, the model ahead on every draw (by 3 to 10 points).

On first use it trains a 4,096-token WordPiece vocab on bert_jax/data/sample_public_domain.txt
(400 KB, 15 documents; NOTICE) and packs it into sequences of up to 64 tokens, then trains
BERT-tiny (2 layers, hidden 128) for 6,000 steps of batch 16, evaluates on the held-out
document (George Washington's 1790 address to Congress) and prints fill_mask predictions for
two sentences cut from that document and two written for this demo (in no document):

  representatives 0.22 / states 0.82 / hare 0.57 / rabbit 0.62 (the top answers, in order)

The objective is the paper's "No NSP" row (Table 5) with dynamic masking, as RoBERTa: on 15
documents NSP memorises its pairs and holds MLM back (docs/history.md); MLM+NSP is
`--config.objective.nsp=True`.

Departures from BERT's recipe, each measured on this run (held-out accuracy, one run each):
no dropout (a 3-minute run underfits: 29.9% without, 22.6% with dropout 0.1 at the previous
recipe; 35.7% vs 32.6% at batch 32), initializer std 0.05 instead of 0.02 (the model leaves
its unigram plateau after ~1k steps instead of ~2k: 35.7% vs 29.0% at batch 32), batch 16 at
lr 1.4e-3 (lr 2e-3 left the plateau late: 29.3%). Batch 32 (lr 2e-3, 3k steps) is as accurate
(35.7%) but slower here, its larger buffers page-faulting without huge-page malloc; training
longer only fits the training text better (batch 32, 4k steps: 50% train, 35.2% held-out).

ARG: `size=NAME` (default tiny) and `steps=N` (default 6000).
"""

from bert_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, size="tiny", steps=6_000)
  c = config_lib.base_config(a.size)
  c.model.vocab_size = c.data.train_vocab_size = 4096
  c.model.dtype = "bfloat16" if config_lib.cpu_has_bf16() else "float32"
  c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
  c.model.initializer_range = 0.05
  c.objective.nsp = False  # FULL-SENTENCES packing (RoBERTa) when NSP is off
  c.data.input = config_lib.BUNDLED_CORPUS
  c.data.max_seq_length = 64
  c.masking.max_predictions = 10  # 15% of 64
  c.data.dupe_factor = 5
  c.data.eval_fraction = 0.05
  c.data.batch_size = 16
  c.masking.mode = "dynamic"
  c.opt.lr = 1.4e-3
  c.opt.total_steps = a.steps
  c.opt.warmup_steps = max(1, a.steps // 20)
  c.ckpt.every_steps = max(1, a.steps // 4)
  c.eval.every_steps = max(1, a.steps // 4)
  c.log.every_steps = max(1, a.steps // 40)
  c.log.fill_mask = (
    # Cut from the held-out document (never trained on).
    "gentlemen of the senate and house of [MASK] : in pursuing the various and weighty "
    "business of the present session .",
    "the general peace and security enjoyed by the united [MASK] .",
    # Written for this demo; not in the corpus.
    "the hatter and the march [MASK] were having tea with alice .",
    "the white [MASK] looked at his watch and ran away .",
  )
  return c
