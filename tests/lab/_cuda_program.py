"""The micro BERT's train step, resolved for a GPU and lowered for CUDA from this CPU host (the
flash and fused-LayerNorm tests count its Triton kernels)."""

import flax.linen as nn
import jax
from unit.test_backends_cpu import _micro_config, _train_batch

from bert_jax import aot, backends, objectives, optim, train
from bert_jax.model import BertForPreTraining


def lowered_for_cuda(kernels: str) -> tuple:
  """(the resolved BertConfig, the StableHLO text) of BERT-tiny's train step with `kernels`,
  the other backend fields 'auto', bf16 and dropout 0.1, lowered for CUDA."""
  c = _micro_config(kernels, dropout=0.1)
  c.model.update(dtype="bfloat16")
  assert (c.model.dropout_rng, c.model.attention_impl) == ("auto", "auto")
  cfg = backends.resolve_kernels(train.bert_config(c), "cuda")
  model = BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)
  step = train.make_train_step(
    model, tx, objectives.Objective.from_config(c), aot._masking_tables(c)
  )
  state = jax.eval_shape(train.state_init_fn(c, model, tx), jax.random.key(0))
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _train_batch(0))
  lowered = jax.jit(step).trace(nn.meta.unbox(state), batch, jax.random.key(1))
  return cfg, lowered.lower(lowering_platforms=("cuda",)).as_text()
