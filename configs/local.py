"""The bundled default: BERT-tiny pretrained with masked LM on the corpus shipped in the package.

  bert_jax_train --config=local --workdir=/tmp/bert_local
  python -m bert_jax.main --config=configs/local.py --workdir=/tmp/bert_local  # from a checkout

Hardware: 2 CPU cores, float32. Time: 3 min 4 s from a fresh clone to the last line, set-up
included (2-core AMD EPYC with AVX512-BF16, 2026-11-24). Reaches held-out MLM accuracy 22.6%
(17.6% at [MASK], perplexity 127) after 10k steps, the same every run; always predicting the
most frequent target gets 9.5%, and a count-based neighbour reference 28.8%
(scripts/ngram_reference.py).

On first use it trains a 4,096-token WordPiece vocab on bert_jax/data/sample_public_domain.txt
(400 KB, 15 documents; NOTICE) and packs it into sequences of up to 64 tokens, then trains
BERT-tiny (2 layers, hidden 128) for 10k steps of batch 8, evaluates on a held-out document and
prints fill_mask predictions. The objective is the paper's "No NSP" row (Table 5) with dynamic
masking, as RoBERTa: on 15 documents NSP memorises its pairs and holds MLM back
(docs/history.md); MLM+NSP is `--config.objective.nsp=True`. float32 because bf16 is emulated
on CPUs without AVX512-BF16; `--config.model.dtype=bfloat16` where the CPU has it.

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
