"""bert_jax.finetune (the package and its command): a batch size the mesh cannot split is one
line; the presets take the pretraining recipe. The engine end to end on small learnable tasks is
tests/e2e/test_finetune_e2e.py; the package's modules have files of their names."""

import pytest

from bert_jax import config_lib, finetune
from unit._finetune_tasks import _splits, finetune_config, sentiment, tiny_config


def test_bad_batch_size_is_one_line(tmp_path):
  c = tiny_config("classification", _splits(tmp_path, sentiment, (16, 8, 8)))
  c.data.batch_size = 12  # 8 devices
  with pytest.raises(
    ValueError, match="batch_size=12 is not divisible by the data-parallel size 8"
  ):
    finetune.finetune(c, str(tmp_path / "run"))


@pytest.mark.parametrize(
  "arg, lr, epochs",
  [
    ("rotten_tomatoes", 3e-5, 3),
    ("stsb,size=tiny", 3e-5, 3),
    ("squadshifts", 5e-5, 2),  # the paper's SQuAD v1.1 recipe
    ("wnut16_ner,features=concat_last4", 1e-3, 5),  # only a fresh BiLSTM tagger trains
  ],
)
def test_presets_take_the_pretraining_recipe(arg, lr, epochs):
  """A preset's model, optimizer and mesh are base_config's, but for fine-tuning's lr and an
  epoch schedule (warmup a fraction of the run) in place of pretraining's step counts."""
  c = finetune_config.get_config(arg)
  size = "tiny" if "size=tiny" in arg else "base"
  base = config_lib.base_config(size)
  assert c.model.to_dict() == {**base.model.to_dict(), "dtype": "float32"}
  assert c.mesh.to_dict() == base.mesh.to_dict()
  recipe = {k: v for k, v in base.opt.to_dict().items() if k not in ("warmup_steps", "total_steps")}
  want = {**recipe, "lr": lr, "epochs": epochs, "min_steps": 100, "warmup_fraction": 0.1}
  assert c.opt.to_dict() == want
