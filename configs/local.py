"""The bundled default: BERT-tiny pretrained with masked LM on the corpus shipped in the package.

On first use it trains a 4,096-token WordPiece vocab on bert_jax/data/sample_public_domain.txt
(400 KB, 15 documents; NOTICE) and packs it into sequences of up to 64 tokens, then trains
BERT-tiny (2 layers, hidden 128) for 6,000 steps of batch 16, evaluates on the held-out
document (George Washington's 1790 address to Congress) and prints fill_mask predictions for
two sentences cut from that document and two written for this demo (in no document); the top
answers: representatives / states / hare / rabbit.

The objective is the paper's "No NSP" row (Table 5) with dynamic masking, as RoBERTa: on 15
documents NSP memorises its pairs and holds MLM back (docs/notes/history.md); MLM+NSP is
`--config.objective.nsp=True`. Departures from BERT's recipe for a 2-minute CPU run (those of
config_lib.scaled_base): no dropout, initializer std 0.05 (not 0.02), batch 16 at lr 1.4e-3;
the measurements behind each are in docs/notes/history.md.

ARG: `size=NAME` (default tiny) and `steps=N` (default 6000).

  bert_jax_train --config=local --workdir=/tmp/bert_local
  python -m bert_jax.main --config=configs/local.py --workdir=/tmp/bert_local  # from a checkout

Hardware: 2 CPU cores; bfloat16 compute where the CPU has AVX512-BF16 or AMX, float32
elsewhere. Time: about 2 minutes from a fresh clone. Expected: held-out MLM accuracy above
the count-based neighbour reference that the final eval prints beside it; the measured figure,
with its machine and date, is the bundled default's row of README.md's Results table.
"""

from bert_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, size="tiny", steps=6_000)
  # The experiments' CPU base (vocab 4,096 trained on the bundled corpus, 16 x 64 tokens, no
  # dropout, init std 0.05, lr 1.4e-3) with the demo's own choices:
  c = config_lib.scaled_base("cpu", size=a.size, steps=a.steps)
  c.objective.nsp = False  # FULL-SENTENCES packing (RoBERTa) when NSP is off
  c.masking.mode = "dynamic"
  c.data.dupe_factor = 5
  c.ckpt.every_steps = max(1, a.steps // 4)
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
