"""bert_jax.config_lib: the `:ARG` parser (typed values, one-line errors), BERT's recipe in the
base config, the scaled base of the experiments, and what a pretraining seed, a data argument
and a phase change."""

import pytest

from bert_jax import config_lib, model_config


def test_parse_arg_types_values_by_their_defaults():
  got = config_lib.parse_arg("small,nsp=False,steps=7,lr=0.5,name=x", size="tiny", nsp=True,
                             steps=1, lr=1.0, name=None)  # fmt: skip
  assert got.to_dict() == {"size": "small", "nsp": False, "steps": 7, "lr": 0.5, "name": "x"}
  assert isinstance(got.steps, int) and isinstance(got.lr, float)
  # A bare key after the first is a True flag; empty items are skipped; no arg: the defaults.
  assert config_lib.parse_arg("a,,b", size="s", b=False).to_dict() == {"size": "a", "b": True}
  assert config_lib.parse_arg(None, size="tiny").to_dict() == {"size": "tiny"}
  assert config_lib.parse_arg("nsp=0", nsp=True).nsp is False
  with pytest.raises(ValueError, match=r"^unknown config argument 'sise'; known: size, nsp$"):
    config_lib.parse_arg("sise=small", size="tiny", nsp=True)
  with pytest.raises(ValueError, match=r"^config argument nsp='maybe' is not a bool$"):
    config_lib.parse_arg("nsp=maybe", nsp=True)
  with pytest.raises(ValueError, match=r"^config argument steps='1e3' is not a int$"):
    config_lib.parse_arg("steps=1e3", steps=1)


def test_base_config_is_berts_recipe_at_each_size():
  c = config_lib.base_config("base")
  assert (c.opt.lr, c.opt.b1, c.opt.b2, c.opt.eps, c.opt.weight_decay) == (1e-4, 0.9, 0.999,
                                                                            1e-6, 0.01)  # fmt: skip
  assert (c.opt.warmup_steps, c.opt.total_steps, c.data.batch_size) == (10_000, 1_000_000, 256)
  assert (c.data.max_seq_length, c.masking.max_predictions, c.masking.prob) == (128, 20, 0.15)
  assert c.objective.to_dict() == {"mlm": True, "nsp": True, "ltr": False}
  # config.model's keys are BertConfig's fields but the derived ones.
  model = config_lib.base_config("large").model.to_dict()
  assert model_config.BertConfig(**model) == model_config.config_for_size("large")
  assert "causal" not in model and "platform" not in model


def test_scaled_base_and_what_seeds_data_and_phases_change(monkeypatch):
  monkeypatch.setattr(config_lib, "cpu_has_bf16", lambda: False)
  c = config_lib.scaled_base("cpu")
  assert (c.model.num_layers, c.model.vocab_size, c.data.train_vocab_size) == (2, 4096, 4096)
  assert c.model.dtype == "float32" and config_lib.scaled_base("gpu").model.dtype == "bfloat16"
  assert (c.data.batch_size, c.data.max_seq_length, c.masking.max_predictions) == (16, 64, 10)
  assert (c.opt.total_steps, c.opt.warmup_steps, c.ckpt.every_steps) == (12_000, 600, 6_000)
  assert c.data.input == config_lib.BUNDLED_CORPUS
  assert config_lib.scaled_base("cpu", steps=40).eval.every_steps == 10
  assert config_lib.scaled_base("full").to_dict() == config_lib.base_config("base").to_dict()
  with pytest.raises(ValueError, match="^scale must be one of full, cpu, gpu, not 'tpu'$"):
    config_lib.scaled_base("tpu")
  seeded = config_lib.pretraining_seed(config_lib.scaled_base("cpu"), 2)
  assert (seeded.seed, seeded.data.seed, seeded.masking.seed) == (2, 12347, 0)  # masks shared
  with pytest.raises(ValueError, match="^seed must be >= 0, not -1$"):
    config_lib.pretraining_seed(c, -1)
  packed = config_lib.scaled_base("cpu")
  packed.objective.nsp = False
  assert config_lib.use_data(packed, "/d").data.dir == "/d/packed"
  assert packed.data.train_vocab_size == 0  # the data's own vocab
  assert config_lib.use_data(config_lib.scaled_base("cpu"), "/d").data.dir == "/d/nsp"
  assert config_lib.use_data(config_lib.scaled_base("cpu"), "").data.dir is None
  two = config_lib.pretraining_phase(config_lib.base_config("base"), 2)
  assert (two.data.max_seq_length, two.masking.max_predictions, two.opt.total_steps) == (
    512, 80, 100_000,
  )  # fmt: skip
  assert config_lib.pretraining_phase(config_lib.base_config("base"), 1).opt.total_steps == 900_000
  with pytest.raises(ValueError, match="^phase must be 1 or 2, not 3$"):
    config_lib.pretraining_phase(c, 3)
