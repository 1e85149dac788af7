"""The micro BERT's train step, resolved for a GPU and lowered for CUDA from this CPU host (the
flash and fused-LayerNorm tests count its Triton kernels), and the counts themselves: the
kernels' Pallas calls are jitted per kernel (one trace and one lowering for all the layers'
identical calls), so a program holds each once and calls it at every layer."""

import re

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


def triton_calls(text: str) -> int:
  """The Triton kernels a StableHLO module runs: the custom calls in `main`, each private
  function's counted at every call of it (recursively)."""
  bodies = {}
  for m in re.finditer(r"func\.func (?:private |public )?@([\w.$-]+)", text):
    end = text.find("func.func ", m.end())
    bodies[m.group(1)] = text[m.end() : end if end >= 0 else len(text)]

  def runs(name: str) -> int:
    body = bodies[name]
    calls = re.findall(r"(?<!\w)call @([\w.$-]+)\(", body)  # not custom_call
    return body.count("__gpu$xla.gpu.triton") + sum(runs(c) for c in calls)

  return runs("main")


def pallas_calls(closed_jaxpr) -> int:
  """The pallas_call equations a jaxpr runs, each sub-jaxpr (a jitted kernel's, a custom VJP's,
  a scan's body) counted wherever it is used."""

  def count(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
      n += eqn.primitive.name == "pallas_call"
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):  # a ClosedJaxpr
            n += count(sub.jaxpr)
          elif hasattr(sub, "eqns"):  # a Jaxpr
            n += count(sub)
    return n

  return count(closed_jaxpr.jaxpr)
