"""The end-to-end half of tests/unit/test_config_schema.py (real processes; slow): see its
docstring."""

import pytest
from unit.test_config_schema import _one_line, _run


@pytest.mark.slow
def test_config_against_devices_and_data_is_refused_before_the_workdir(tmp_path):
  """Checks that need the devices or the data (here: the vocab a first run would build with,
  and the mesh) also come before the workdir: exit 2, no workdir, no data built."""
  r = _run("bert_jax.main", "--config=local:steps=20", "--workdir=wd",
           "--config.data.train_vocab_size=0", cwd=tmp_path)  # fmt: skip
  assert _one_line(r, "main") == (
    "config.model.vocab_size=4096 does not match the data's tokenizer (wordpiece, vocab_size=30522)"
  )
  r = _run("bert_jax.main", "--config=local:steps=20", "--workdir=wd", "--num_cpu_devices=8",
           "--config.data.batch_size=12", cwd=tmp_path)  # fmt: skip
  assert _one_line(r, "main").startswith(
    "micro-batch 12 (config.data.batch_size=12 / grad_accum_steps=1) is not divisible by the "
    "data-parallel size 8"
  )
  r = _run("bert_jax.main", "--config=local:steps=20", "--workdir=wd",
           "--config.mesh.shape=2,2,1", cwd=tmp_path)  # fmt: skip
  assert _one_line(r, "main") == (
    "config.mesh.shape: mesh shape (2, 2, 1) needs 4 devices but 1 are available"
  )
  assert list(tmp_path.iterdir()) == []
