"""A tiny BERT config, random params of it and a jitted apply per config, for the model's unit tests
(test_model, test_layer_scan, test_backends_*)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import model as model_lib
from bert_jax.model import BertForPreTraining, BertModel
from bert_jax.model_config import BertConfig

TINY = BertConfig(
  vocab_size=128,
  hidden_size=32,
  num_layers=2,
  num_heads=4,
  intermediate_size=64,
  max_position_embeddings=32,
)


@functools.cache
def _params(cfg: BertConfig, pretraining: bool = True, seed: int = 0):
  """Random params of the model's exact shapes, drawn in numpy.

  Cheaper than model.init (compiling ~40 truncated-normal inits costs seconds on CPU), and
  every tensor -- biases and LayerNorm too -- is non-trivial, so none can be silently ignored.
  """
  return random_params(model_lib.abstract_params(cfg, pretraining), seed)


def random_params(abstract, seed: int = 0):
  rng = np.random.default_rng(seed)

  def draw(path, x):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return jnp.asarray(1.0 + 0.1 * rng.standard_normal(x.shape), x.dtype)
    return jnp.asarray(0.1 * rng.standard_normal(x.shape), x.dtype)

  return jax.tree_util.tree_map_with_path(draw, abstract)


def _batch(lengths, length, vocab=128, seed=0):
  """Right-padded ids (pads are 0), two segments, mask."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, (len(lengths), length)).astype(np.int32)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
  seg = ((np.arange(length)[None] >= np.array(lengths)[:, None] // 2) * mask).astype(np.int32)
  return ids * mask, seg, mask


def _apply(cfg, pretraining=True, **kw):
  return _jitted_apply(cfg, pretraining, tuple(sorted(kw.items())))


@functools.cache  # one compiled function per config, shared by the tests below
def _jitted_apply(cfg, pretraining, kw):
  model = BertForPreTraining(cfg) if pretraining else BertModel(cfg)
  return jax.jit(lambda p, *a: model.apply({"params": p}, *a, **dict(kw)))


def _loss_fn(cfg):
  model = BertForPreTraining(cfg)
  ids, seg, mask = _batch([8, 6], 8)
  pos = np.array([[1, 3], [2, 5]], np.int32)
  targets = np.array([[5, 9], [11, 13]], np.int32)

  def loss(p):
    out = model.apply({"params": p}, ids, seg, mask, pos)
    logp = jax.nn.log_softmax(out["mlm_logits"])
    mlm = -jnp.take_along_axis(logp, targets[..., None], -1).mean()
    nsp = -jax.nn.log_softmax(out["nsp_logits"])[:, 0].mean()
    return mlm + nsp

  return loss
