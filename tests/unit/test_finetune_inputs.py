"""bert_jax.finetune.inputs: every preset's model config and tokenizer, the batch sizes against
the mesh, the weights' content hash."""

import numpy as np
import pytest

from bert_jax.config_schema import ConfigError
from bert_jax.finetune import inputs as ft_inputs
from bert_jax.tasks import kinds
from unit._finetune_tasks import finetune_config


@pytest.mark.parametrize("task", [*finetune_config.SHARED, *finetune_config.GLUE, "custom"])
def test_every_preset_builds(task):
  c = finetune_config.get_config(f"{task},size=tiny")
  assert c.task.kind in kinds.KINDS
  cfg, tok = ft_inputs.model_config(c)
  assert cfg.num_layers == 2 and tok.vocab_size == cfg.vocab_size


def test_batch_sizes_are_checked_against_the_mesh():
  from bert_jax import sharding as sh

  c = finetune_config.get_config("custom,size=tiny")
  c.mesh.shape = (2, 2, 2)  # data x fsdp = 4
  c.data.batch_size, c.data.eval_batch_size, c.opt.grad_accum_steps = 8, 12, 2
  mesh, _ = ft_inputs.make_mesh(c)
  assert sh.data_parallel_size(mesh) == 4
  c.data.eval_batch_size = 6
  with pytest.raises(ConfigError, match=r"^config.data.eval_batch_size=6 is not divisible by "
                     r"the data-parallel size 4 \(mesh data x fsdp = "):  # fmt: skip
    ft_inputs.make_mesh(c)
  c.data.eval_batch_size, c.opt.grad_accum_steps = 8, 4  # micro-batches of 2
  with pytest.raises(ConfigError, match="the micro-batch .* is not divisible"):
    ft_inputs.make_mesh(c)


def test_params_sha256_covers_names_dtypes_shapes_and_bytes():
  params = {"b": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)},
            "a": {"bias": np.zeros(3, np.float32)}}  # fmt: skip
  h = ft_inputs.params_sha256(params)
  assert len(h) == 64 and h == ft_inputs.params_sha256(dict(reversed(params.items())))
  changed = [
    {**params, "a": {"bias": np.array([0, 0, 1e-7], np.float32)}},  # one value
    {**params, "a": {"bias": np.zeros(3, np.float64)}},  # dtype
    {**params, "b": {"kernel": params["b"]["kernel"].reshape(3, 2)}},  # shape, same bytes
    {"b": params["b"], "c": params["a"]},  # name
  ]
  assert len({h, *map(ft_inputs.params_sha256, changed)}) == 5
