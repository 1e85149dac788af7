"""Every field of the trainer's, fine-tuning's and the data builder's configs: its type, its
allowed values or range, checked in one place before anything is written.

  config_schema.check_pretraining(config)   # python -m bert_jax.main's --config
  finetune.schema.check_finetuning(config)  # python -m bert_jax.finetune's --config (its
                                            # fields' rules live with fine-tuning)
  config_schema.check_data_build(options)   # python -m bert_jax.create_data's flags

Each raises `ConfigError` (a ValueError) whose one line names the field, the bad value and
what is allowed: `config.masking.mode='dynamc': must be one of static, dynamic`. The commands
check their config right after parsing the flags and exit with status 2, before a directory or
a file is created; `cli.run` also gives status 2 to a `ConfigError` raised later, by the
checks of a config against the devices or the data (still before anything is written).

A field's rule is a `Rule` in PRETRAINING, DATA_BUILD or finetune.schema.FINETUNING; what
cannot be said per field (one value against another) is in the `_cross_*` functions. The
values of the model's backend fields are model_config's (KERNELS, DROPOUT_RNGS,
ATTENTION_IMPLS), read when a config is checked. A field without a rule is not checked
(tests/unit/test_config_schema.py fails for every field of a bundled config that has none).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# jax's PRNG keys take a 32-bit seed (x64 off): key(2**32) is key(0), key(-1) is key(2**32-1).
SEED_MAX = 2**32 - 1


class ConfigError(ValueError):
  """A config value or flag that cannot run (the command exits with status 2)."""


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field may hold. `choices`: the allowed values (or a function returning them,
  read when checked); `low`/`high`: a closed range unless `low_open`/`high_open`; `none`: None
  (an unset placeholder) is allowed; `each`: the rule of every element of a tuple; `note`:
  why, or what a special value means, added to the error."""

  kind: str  # int | float | bool | str | tuple
  choices: tuple | Callable[[], Iterable[Any]] | None = None
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  none: bool = False
  each: Rule | None = None
  note: str = ""

  def values(self) -> tuple:
    return tuple(self.choices() if callable(self.choices) else self.choices)

  def problem(self, value: Any) -> str | None:
    """Why `value` is not allowed ('must be ...'), or None."""
    if value is None:
      return None if self.none else f"must be {self.describe()}, not unset"
    if self.kind == "bool":
      ok = isinstance(value, bool)
    elif self.kind == "int":
      ok = isinstance(value, int) and not isinstance(value, bool)
    elif self.kind == "float":
      ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif self.kind == "str":
      ok = isinstance(value, str)
    else:
      ok = isinstance(value, tuple | list)
    if not ok:
      return f"must be {self.describe()}, not a {type(value).__name__}"
    if self.kind == "tuple":
      for i, item in enumerate(value):
        why = self.each.problem(item) if self.each else None
        if why:
          return f"element {i} ({item!r}) {why}"
      return None
    if self.choices is not None and value not in self.values():
      return f"must be {self.describe()}"
    if self.kind in ("int", "float"):
      if not math.isfinite(value):
        return f"must be {self.describe()}"
      below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
      above = self.high is not None and (
        value >= self.high if self.high_open else value > self.high
      )
      if below or above:
        return f"must be {self.describe()}"
    return None

  def describe(self) -> str:
    if self.choices is not None:
      return "one of " + ", ".join(repr(v) if v == "" else str(v) for v in self.values())
    name = {"int": "an integer", "float": "a number", "bool": "True or False", "str": "a string"}
    if self.kind == "tuple":
      return "a tuple" + (f" of {self.each.describe()}" if self.each else "")
    text = name[self.kind]
    lo, hi = _num(self.low), _num(self.high)
    if self.low is not None and self.high is not None:
      text += f" in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
    elif self.low is not None:
      text += f" {'>' if self.low_open else '>='} {lo}"
    elif self.high is not None:
      text += f" {'<' if self.high_open else '<='} {hi}"
    return text


def _num(x: float | None) -> str:
  return "" if x is None else (str(int(x)) if float(x).is_integer() else str(x))


def Int(low=None, high=None, **kw) -> Rule:  # noqa: N802 -- rule constructors read as types
  return Rule("int", low=low, high=high, **kw)


def Float(low=None, high=None, **kw) -> Rule:  # noqa: N802
  return Rule("float", low=low, high=high, **kw)


def Bool() -> Rule:  # noqa: N802
  return Rule("bool")


def Str(**kw) -> Rule:  # noqa: N802
  return Rule("str", **kw)


def OneOf(choices, **kw) -> Rule:  # noqa: N802
  return Rule("str", choices=choices, **kw)


def Tuple(each: Rule | None = None) -> Rule:  # noqa: N802
  return Rule("tuple", each=each)


def _within(prefix: str, rules: Mapping[str, Rule]) -> dict[str, Rule]:
  return {f"{prefix}.{k}": r for k, r in rules.items()}


# The model's fields are looked up when a config is checked: another version of model_config
# may add or drop a backend value, never this module.
def _model_values(name: str) -> Callable[[], tuple]:
  def values() -> tuple:
    from bert_jax import model_config

    return tuple(getattr(model_config, name))

  return values


def _remat_policies() -> tuple:
  from bert_jax import model_config

  return tuple(model_config.REMAT_POLICIES)


SEED = Int(0, SEED_MAX, note="seeds are 32-bit: a larger one repeats a smaller one's draws")
DROPOUT = Float(
  0, 1, high_open=True, note="a dropout probability of 1 zeroes every activation: nothing trains"
)
DTYPES = ("float32", "bfloat16", "float16")
EVERY = Int(1)
PROBABILITY = Float(0, 1)

MODEL: dict[str, Rule] = {
  "vocab_size": Int(1),
  "hidden_size": Int(1),
  "num_layers": Int(1),
  "num_heads": Int(1),
  "intermediate_size": Int(1),
  "max_position_embeddings": Int(1),
  "type_vocab_size": Int(1),
  "hidden_dropout_prob": DROPOUT,
  "attention_dropout_prob": DROPOUT,
  "layer_norm_eps": Float(0, low_open=True),
  "initializer_range": Float(0, low_open=True),
  "dtype": OneOf(DTYPES),
  "param_dtype": OneOf(DTYPES),
  "scan_layers": Bool(),
  "unroll_last_layer": Bool(),
  "remat_policy": OneOf(_remat_policies),
  "prune_last_layer": Bool(),
  "kernels": OneOf(_model_values("KERNELS")),
  "dropout_rng": OneOf(_model_values("DROPOUT_RNGS")),
  "attention_impl": OneOf(_model_values("ATTENTION_IMPLS")),
}

# The optimizer fields pretraining and fine-tuning share.
OPT: dict[str, Rule] = {
  "name": OneOf(("adamw", "lamb")),
  "lr": Float(0, low_open=True, note="a learning rate <= 0 does not train"),
  "b1": Float(0, 1, high_open=True),
  "b2": Float(0, 1, high_open=True),
  "eps": Float(0),
  "weight_decay": Float(0),
  "clip_norm": Float(0, note="the global gradient norm clipped to; 0: no clipping"),
  "grad_accum_steps": Int(1),
  "nonfinite": OneOf(("stop", "skip")),
  "max_consecutive_skips": Int(1),
}

MESH: dict[str, Rule] = {
  "shape": Tuple(Int(-1)),  # its length and entries: `_check_mesh_shape`
  "rules": Tuple(Tuple()),  # each a (logical axis, mesh axes) pair: sharding.rules_from_config
}

PRETRAINING: dict[str, Rule] = {
  "seed": SEED,
  "init_from": Str(none=True),
  "resume_allow_changes": Str(),
  **_within("model", MODEL),
  "objective.mlm": Bool(),
  "objective.nsp": Bool(),
  "objective.ltr": Bool(),
  "masking.mode": OneOf(("static", "dynamic")),
  "masking.seed": SEED,
  "masking.max_predictions": Int(1),
  "masking.prob": Float(0, 1, low_open=True),
  "masking.whole_word": Bool(),
  "data.dir": Str(none=True),
  "data.input": Str(none=True),
  "data.vocab": Str(none=True),
  "data.train_vocab_size": Int(0, none=True, note="0 or unset: use data.vocab (BERT's if unset)"),
  "data.max_seq_length": Int(8, 65535),
  "data.dupe_factor": Int(1),
  "data.short_seq_prob": PROBABILITY,
  "data.eval_fraction": Float(
    0,
    1,
    low_open=True,
    high_open=True,
    note="the share of documents held out for the eval split, which every run evaluates on",
  ),
  "data.seed": SEED,
  "data.batch_size": Int(1),
  "data.worker_count": Int(0, note="0: read in the training process"),
  **_within("opt", OPT),
  "opt.warmup_steps": Int(0),
  "opt.total_steps": Int(1),
  **_within("mesh", MESH),
  "ckpt.every_steps": EVERY,
  "ckpt.keep": Int(1, note="how many checkpoints are kept; 0 would keep none of the run"),
  "ckpt.async_save": Bool(),
  "eval.every_steps": Int(0, note="0: only at the last step"),
  "eval.batch_size": Int(1, none=True),
  "eval.max_batches": Int(0, none=True, note="0 or unset: the whole eval split"),
  "log.every_steps": EVERY,
  "log.peak_flops": Float(0, low_open=True, none=True),
  "log.fill_mask": Tuple(Str()),
}


# create_data's flags (the keyword arguments of pretraining_data.build).
DATA_BUILD: dict[str, Rule] = {
  "max_seq_length": PRETRAINING["data.max_seq_length"],
  "max_predictions_per_seq": Int(1),  # at most max_seq_length: `_cross_data_build`
  "masked_lm_prob": PRETRAINING["masking.prob"],
  "short_seq_prob": PROBABILITY,
  "dupe_factor": Int(1),
  "seed": SEED,
  "nsp": Bool(),
  "packing": OneOf(("full_sentences", "doc_sentences")),
  "eval_fraction": Float(0, 1, high_open=True, note="0: no eval split"),
  "write_masks": Bool(),
  "whole_word_mask": Bool(),
  "num_workers": Int(0, none=True, note="unset: one per CPU; 0 or 1: no worker processes"),
  "records_per_shard": Int(1),
  "overwrite": Bool(),
  "progress": Bool(),
}

# resume_allow_changes names beside the config's own fields and sections.
RESUME_NAMES = {
  "pretraining": ("*", "tokenizer", "dataset"),
  "finetuning": ("*",),
}


# ----------------------------------------------------------------------------- checking


def _leaves(config: Any) -> dict[str, Any]:
  """{dotted path: value} of a ConfigDict (or nested dicts)."""
  from bert_jax import trees

  tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  return trees.flatten(tree, ".")


def _check_fields(values: Mapping[str, Any], schema: Mapping[str, Rule], prefix: str) -> None:
  for name, rule in schema.items():
    if name not in values:
      continue  # a config without the field (another command's section, an older config)
    why = rule.problem(values[name])
    if why:
      note = rule.note or (rule.each.note if rule.each else "")
      raise ConfigError(f"{prefix}{name}={values[name]!r}: {why}" + (f" ({note})" if note else ""))


def unchecked_fields(config: Any, schema: Mapping[str, Rule]) -> list[str]:
  """The fields of `config` that `schema` has no rule for (tests keep this empty)."""
  return sorted(k for k in _leaves(config) if k not in schema)


def check_config(
  config: Any, schema: Mapping[str, Rule], cross: Callable[[Mapping[str, Any]], None], command: str
) -> None:
  """Every field of `config` against `schema`, then the fields that constrain each other (the
  common ones, then `cross`'s), then resume_allow_changes' names (`RESUME_NAMES[command]`); a
  ConfigError names the first that cannot run."""
  from bert_jax.runtime import resume

  values = _leaves(config)
  _check_fields(values, schema, "config.")
  _cross_common(values)
  cross(values)
  # Each name of resume_allow_changes is a field or section of the config (or one of the
  # command's RESUME_NAMES): a misspelt one would let nothing through, and say nothing.
  names = RESUME_NAMES[command]
  for name in resume.parse_allowed(values.get("resume_allow_changes", "")):
    if name in names or name.split(".")[0] in names or name in resume.KEEPS_EXACT:
      continue
    if any(f == name or f.startswith(name + ".") for f in values):
      continue
    raise ConfigError(
      f"config.resume_allow_changes: {name!r} is no field or section of this config (nor "
      f"one of {', '.join(names)})"
    )


def check_pretraining(config: Any) -> None:
  """Every field of a pretraining config (`configs/bert_base.py` and the others) and the
  fields that constrain each other; a ConfigError names the first that cannot run."""
  check_config(config, PRETRAINING, _cross_pretraining, "pretraining")


def check_data_build(options: Mapping[str, Any]) -> None:
  """create_data's flags (`pretraining_data.build`'s options), named as flags."""
  _check_fields(options, DATA_BUILD, "--")
  if options.get("max_predictions_per_seq", 1) > options.get("max_seq_length", 65535):
    raise ConfigError(
      f"--max_predictions_per_seq={options['max_predictions_per_seq']}: must be at most "
      f"--max_seq_length={options['max_seq_length']}"
    )


def _cross_common(v: Mapping[str, Any]) -> None:
  if "model.hidden_size" in v and v["model.hidden_size"] % v["model.num_heads"]:
    raise ConfigError(
      f"config.model.hidden_size={v['model.hidden_size']}: must be a multiple of "
      f"config.model.num_heads={v['model.num_heads']}"
    )
  impl = v.get("model.attention_impl")
  if impl in ("xla", "cudnn") and v.get("model.attention_dropout_prob", 0) > 0:
    raise ConfigError(
      f"config.model.attention_impl={impl!r} has no attention dropout: set "
      f"config.model.attention_dropout_prob=0 (it is {v['model.attention_dropout_prob']}) or "
      "attention_impl to one that has it (auto, explicit, ...)"
    )
  if "data.batch_size" in v and v["data.batch_size"] % v["opt.grad_accum_steps"]:
    raise ConfigError(
      f"config.data.batch_size={v['data.batch_size']}: must be a multiple of "
      f"config.opt.grad_accum_steps={v['opt.grad_accum_steps']}"
    )
  if "mesh.shape" in v:
    _check_mesh_shape(v["mesh.shape"])
  if "mesh.rules" in v:
    from bert_jax import sharding

    try:
      sharding.rules_from_config(v["mesh.rules"])
    except (ValueError, TypeError) as e:
      raise ConfigError(f"config.mesh.rules: {e}") from None


def _check_mesh_shape(shape: Any) -> None:
  from bert_jax import sharding

  axes = sharding.MESH_AXES
  shape = tuple(shape)
  bad = (
    len(shape) != len(axes)
    or shape.count(-1) > 1
    or any(not isinstance(s, int) or s == 0 or s < -1 for s in shape)
  )
  if bad:
    raise ConfigError(
      f"config.mesh.shape={shape}: must be {len(axes)} sizes ({', '.join(axes)}), each >= 1 "
      "or one -1 (the devices left)"
    )


def _cross_pretraining(v: Mapping[str, Any]) -> None:
  if v["objective.mlm"] == v["objective.ltr"]:
    raise ConfigError(
      f"config.objective.mlm={v['objective.mlm']} and config.objective.ltr="
      f"{v['objective.ltr']}: exactly one of them must be True"
    )
  if v["objective.nsp"] and v["model.type_vocab_size"] < 2:
    raise ConfigError(
      f"config.model.type_vocab_size={v['model.type_vocab_size']}: must be >= 2 with "
      "config.objective.nsp=True (a sentence pair's second segment is token type 1)"
    )
  seq = v["data.max_seq_length"]
  if seq > v["model.max_position_embeddings"]:
    raise ConfigError(
      f"config.data.max_seq_length={seq}: must be at most "
      f"config.model.max_position_embeddings={v['model.max_position_embeddings']}"
    )
  if v["masking.max_predictions"] > seq:
    raise ConfigError(
      f"config.masking.max_predictions={v['masking.max_predictions']}: must be at most "
      f"config.data.max_seq_length={seq}"
    )
  if v["opt.warmup_steps"] >= v["opt.total_steps"]:
    raise ConfigError(
      f"config.opt.warmup_steps={v['opt.warmup_steps']}: must be below "
      f"config.opt.total_steps={v['opt.total_steps']}"
    )
  n_vocab = v["data.train_vocab_size"]
  if not v["data.dir"] and n_vocab:
    if v["data.vocab"]:
      raise ConfigError(
        f"config.data.train_vocab_size={n_vocab} and config.data.vocab={v['data.vocab']!r}: "
        "set one of them (0 or '')"
      )
    if n_vocab != v["model.vocab_size"]:
      raise ConfigError(
        f"config.data.train_vocab_size={n_vocab}: must equal config.model.vocab_size="
        f"{v['model.vocab_size']} (the vocab it trains is the model's)"
      )
  from bert_jax.tokenizers.tokenizer import MASK_TEXT

  for text in v["log.fill_mask"]:
    if MASK_TEXT not in text:
      raise ConfigError(f"config.log.fill_mask: {text!r} has no {MASK_TEXT} to fill")
