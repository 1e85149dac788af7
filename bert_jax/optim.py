"""Optimizers (optax): BERT's AdamW and LAMB, warmup + linear decay, global-norm clipping."""

from __future__ import annotations

from typing import Any

import jax
import optax

# Parameter leaves that BERT excludes from weight decay (LayerNorm scale/bias and all biases).
NO_DECAY_LEAVES = ("bias", "scale")


def learning_rate_schedule(opt: Any) -> optax.Schedule:
  """Linear warmup from 0 to `opt.lr` over `warmup_steps`, then linear decay to 0 at
  `total_steps` (BERT's polynomial decay with power 1)."""
  warmup = int(opt.warmup_steps)
  total = int(opt.total_steps)
  if total <= 0:
    raise ValueError(f"opt.total_steps must be positive, got {total}")
  if warmup >= total:
    raise ValueError(f"opt.warmup_steps ({warmup}) must be below opt.total_steps ({total})")
  if warmup == 0:
    return optax.linear_schedule(opt.lr, 0.0, total)
  return optax.join_schedules(
    [
      optax.linear_schedule(0.0, opt.lr, warmup),
      optax.linear_schedule(opt.lr, 0.0, total - warmup),
    ],
    [warmup],
  )


def decay_mask(params: Any) -> Any:
  """True for leaves that get weight decay: kernels and embeddings, not LayerNorm or biases."""

  def leaf_name(path) -> str:
    last = path[-1]
    return str(getattr(last, "key", getattr(last, "name", last)))

  return jax.tree_util.tree_map_with_path(lambda p, _: leaf_name(p) not in NO_DECAY_LEAVES, params)


def make_optimizer(opt: Any) -> optax.GradientTransformation:
  """From `config.opt`: name adamw|lamb, lr, b1, b2, eps, weight_decay, clip_norm."""
  schedule = learning_rate_schedule(opt)
  if opt.name == "adamw":
    core = optax.adamw(
      schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=decay_mask
    )
  elif opt.name == "lamb":
    core = optax.lamb(
      schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=decay_mask
    )
  else:
    raise ValueError(f"config.opt.name must be 'adamw' or 'lamb', not {opt.name!r}")
  if opt.clip_norm and opt.clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt.clip_norm), core)
  return core
