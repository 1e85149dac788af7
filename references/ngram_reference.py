"""The count-based reference for held-out MLM accuracy, now `bert_jax/ngram_reference.py`: the
trainer prints it beside its final eval and writes it into metrics.jsonl, and the report puts
it beside each point. This script is the same command, kept for old notes:

  python references/ngram_reference.py WORKDIR    # = python -m bert_jax.ngram_reference WORKDIR
"""

import sys

from bert_jax import ngram_reference

if __name__ == "__main__":
  ngram_reference.main(sys.argv[1:])
