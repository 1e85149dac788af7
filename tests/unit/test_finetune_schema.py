"""bert_jax.finetune.schema: every field of the fine-tuning presets has a rule; a bad value is
refused naming the field, the value and what is allowed."""

import pytest

from bert_jax import config_schema
from bert_jax.finetune import schema as ft_schema


def _finetune_config(arg: str = "custom"):
  from configs import finetune

  return finetune.get_config(arg)


def test_every_field_of_the_finetuning_presets_has_a_rule_and_passes():
  from configs import finetune

  for name in (*finetune.SHARED, *finetune.GLUE, "custom", "wnut16_ner,features=concat_last4"):
    c = finetune.get_config(name)
    ft_schema.check_finetuning(c)
    assert config_schema.unchecked_fields(c, ft_schema.FINETUNING) == [], name


FINETUNE_REFUSED = [
  ("opt.lr", 0.0, "config.opt.lr=0.0: must be a number > 0"),
  ("opt.epochs", 0, "config.opt.epochs=0: must be an integer >= 1"),
  ("opt.warmup_fraction", 1.0, "config.opt.warmup_fraction=1.0: must be a number in [0, 1)"),
  ("ckpt.keep", 0, "config.ckpt.keep=0: must be an integer >= 1"),
  ("seeds", 0, "config.seeds=0: must be an integer >= 1"),
  ("task.kind", "clasification", "config.task.kind='clasification': must be one of "
   "classification, regression, tagging, span_qa, multiple_choice"),
  ("task.format", "json", "config.task.format='json': must be one of auto, jsonl, csv"),
  ("task.labels_from", "dev", "config.task.labels_from='dev': must be one of train, all"),
  ("task.metrics", ("acc",), "config.task.metrics: 'acc' is not a metric of a classification"),
  ("grid.lr", (3e-5, -1.0), "config.grid.lr=(3e-05, -1.0): element 1 (-1.0) must be a number > 0"),
  ("features.combine", "mean", "config.features.combine='mean': must be one of concat, "
   "weighted_sum"),
  ("model.hidden_dropout_prob", 1.0, "config.model.hidden_dropout_prob=1.0: must be a number in "
   "[0, 1)"),
  ("eval.every_steps", -1, "config.eval.every_steps=-1: must be an integer >= 0 (0: after every "
   "epoch)"),
  ("data.batch_size", 0, "config.data.batch_size=0: must be an integer >= 1"),
]  # fmt: skip


@pytest.mark.parametrize(
  "field, value, message", FINETUNE_REFUSED, ids=[f for f, *_ in FINETUNE_REFUSED]
)
def test_finetuning_values_refused_with_the_field_named(field, value, message):
  c = _finetune_config()
  section, key = field.rsplit(".", 1) if "." in field else ("", field)
  (c[section] if section else c)[key] = value
  with pytest.raises(config_schema.ConfigError) as e:
    ft_schema.check_finetuning(c)
  assert str(e.value).startswith(message), str(e.value)
