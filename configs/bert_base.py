"""BERT-Base pretraining, the paper's recipe (Devlin et al. 2019, appendix A.2).

Phase 1 (90% of steps at sequence length 128):
  python -m bert_jax.main --config=bert_base --workdir=$WD/phase1 \
      --config.data.dir=$DATA/wiki_books_128
Phase 2 (the last 10% at length 512, weights from phase 1):
  python -m bert_jax.main --config=bert_base:phase=2 --workdir=$WD/phase2 \
      --config.data.dir=$DATA/wiki_books_512 --config.init_from=$WD/phase1

ARG: `size=NAME` (a bare first value works: `:large`, `:L6_H768_A12`; see
bert_jax.model_config.SIZES) and `phase=1|2`.

Hardware: the paper's 4 Cloud TPUs (16 chips); on a v5e-16 add --config.mesh.shape='(1,16,1)'
(FSDP) and check the fit first with `python -m bert_jax.aot --config=bert_base
--topology=v5e-16`. Time: 4 days there. Expected: pretraining MLM accuracy ~0.7 and NSP
accuracy ~0.97-0.98, what BERT-Base reaches (bert_jax has not run it end to end: no TPU has
been available). Fit: docs/aot_fit.md.
"""

from bert_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, size="base", phase=1)
  c = config_lib.base_config(a.size)
  return config_lib.pretraining_phase(c, a.phase)
