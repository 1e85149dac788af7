"""BERT's hyper-parameters: `BertConfig` (the keys of `config.model` in configs/) and the named
sizes (the released models and the paper's Table 6).

The values its backend fields take and what a platform runs for 'auto': bert_jax/backends.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp

# The values of BertConfig's backend fields (what each runs per platform: bert_jax/backends).
KERNELS = ("auto", "xla", "cpu", "fused")
DROPOUT_RNGS = ("auto", "threefry", "hash")
ATTENTION_IMPLS = ("auto", "explicit", "explicit_lowp", "xla", "cudnn", "flash")
# Values earlier versions had, as their checkpoints' configs are read (`retired_to_current`):
# 'lowp' computed what 'xla' computes, 'hash_redraw' drew the 'hash' masks; 'rbg' drew masks no
# current value draws ('auto': a resume reports the change).
RETIRED = {
  "attention_impl": {"fused": "auto"},
  "kernels": {"lowp": "xla"},
  "dropout_rng": {"rbg": "auto", "hash_redraw": "hash"},
}


def retired_to_current(fields: dict[str, Any]) -> dict[str, Any]:
  """`fields` (a stored BertConfig) with the values of earlier versions (`RETIRED`) replaced."""
  return {k: RETIRED.get(k, {}).get(v, v) if isinstance(v, str) else v for k, v in fields.items()}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Every hyper-parameter of the network; the keys of `config.model` in configs/."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_prob: float = 0.1
  attention_dropout_prob: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  # Left-to-right (causal) self-attention, for the paper's LTR ablation.
  causal: bool = False
  # Compute dtype; params are stored in param_dtype. Softmax, LayerNorm statistics, logits
  # and losses are always float32.
  dtype: str = "float32"
  param_dtype: str = "float32"
  # Speed switches: what each value runs and the measurement behind each default in
  # docs/gpu.md ("Model paths and why each stays").
  scan_layers: bool = False  # nn.scan over the layers (compile time independent of depth)
  unroll_last_layer: bool = False  # with scan_layers: the last layer unrolled (and pruned)
  remat_policy: str = "none"  # none | full | dots | dots_no_batch | minimal | gelu
  prune_last_layer: bool = True  # the last layer only where the heads read (same losses)
  kernels: str = "auto"  # auto | xla | cpu (XLA:CPU kernels) | fused (xla + Pallas add+LayerNorm)
  dropout_rng: str = "auto"  # auto | threefry | hash (MLM masking never uses it)
  attention_impl: str = "auto"  # auto | explicit | explicit_lowp | xla | cudnn | flash
  # The platform `backends.resolve_kernels` resolved the 'auto' fields for ('' = not yet).
  platform: str = ""

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(
        f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
      )
    if self.kernels not in KERNELS:
      raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {self.kernels!r}")
    if self.dropout_rng not in DROPOUT_RNGS:
      raise ValueError(
        f"dropout_rng must be one of {', '.join(DROPOUT_RNGS)}, not {self.dropout_rng!r}"
      )
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f"attention_impl must be one of {', '.join(ATTENTION_IMPLS)}, not {self.attention_impl!r}"
      )
    if self.attention_impl in ("xla", "cudnn") and self.attention_dropout_prob > 0:
      raise ValueError(
        f"attention_impl={self.attention_impl!r} has no attention dropout: set "
        f"attention_dropout_prob=0 (it is {self.attention_dropout_prob}) or attention_impl to "
        "auto, explicit, explicit_lowp or flash"
      )
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"remat_policy {self.remat_policy!r} not in {sorted(REMAT_POLICIES)}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in ("float32", "bfloat16", "float16"):
        raise ValueError(
          f"{name} must be float32, bfloat16 or float16, not {getattr(self, name)!r}"
        )

  @property
  def last_layer_prunable(self) -> bool:
    """Whether pretraining with masked positions runs the last layer only where the heads
    read (`prune_last_layer`; scanned layers share one layer body, so they prune only with
    `unroll_last_layer`)."""
    return self.prune_last_layer and (not self.scan_layers or self.unroll_last_layer)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def storage_dtype(self):
    return jnp.dtype(self.param_dtype)


# remat_policy -> the layers' `nn.remat` policy (None: the layers are not rematerialised).
REMAT_POLICIES = {
  "none": None,
  "full": jax.checkpoint_policies.nothing_saveable,
  "dots": jax.checkpoint_policies.checkpoint_dots,
  "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
  "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  # Only the FFN's GELU: its derivative computed from its input in the backward
  # (`layer_scan.recomputed_gelu`), so autodiff's intermediates (a product, erfc, exp) are not
  # kept: docs/gpu.md, "Model paths and why each stays".
  "gelu": None,
}


# ----------------------------------------------------------------------------- sizes

# (num_layers, hidden_size, num_heads); intermediate = 4 * hidden.
SIZES = {
  "tiny": (2, 128, 2),
  "mini": (4, 256, 4),
  "small": (4, 512, 8),
  "medium": (8, 512, 8),
  "base": (12, 768, 12),
  "large": (24, 1024, 16),
  # The paper's Table 6 (ablation over model size).
  "L3_H768_A12": (3, 768, 12),
  "L6_H768_A3": (6, 768, 3),
  "L6_H768_A12": (6, 768, 12),
  "L12_H768_A12": (12, 768, 12),
  "L12_H1024_A16": (12, 1024, 16),
  "L24_H1024_A16": (24, 1024, 16),
}


def size_fields(name: str) -> dict[str, int]:
  """BertConfig fields for a named size ('tiny' ... 'large', a Table 6 row, or any size named
  as the paper names them, 'L{layers}_H{hidden}_A{heads}')."""
  m = re.fullmatch(r"L(\d+)_H(\d+)_A(\d+)", name)
  if name in SIZES:
    n, d, h = SIZES[name]
  elif m and int(m[2]) % int(m[3]) == 0 and min(map(int, m.groups())) > 0:
    n, d, h = map(int, m.groups())
  else:
    raise ValueError(
      f"unknown model size {name!r}; choose from {', '.join(SIZES)} or L<layers>_H<hidden>_A<heads>"
      " (hidden a multiple of heads)"
    )
  return dict(num_layers=n, hidden_size=d, num_heads=h, intermediate_size=4 * d)


def config_for_size(name: str, **overrides: Any) -> BertConfig:
  return BertConfig(**{**size_fields(name), **overrides})
