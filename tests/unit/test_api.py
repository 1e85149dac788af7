"""bert_jax.api and `bert_jax.load`: its parameters shown where a user looks (help), any
checkpoint onto one device in the compute dtype asked for, and one-line errors."""

import inspect

import jax
import numpy as np
import pytest
from tiny_models import CFG, random_params

import bert_jax
from bert_jax import api
from bert_jax.interop import hf_io


def test_help_of_bert_jax_load_shows_its_parameters():
  shown = inspect.signature(bert_jax.load).parameters
  assert list(shown) == list(inspect.signature(api.load).parameters) == [
    "path", "step", "device", "dtype",
  ]  # fmt: skip
  assert not any(p.kind is p.VAR_KEYWORD for p in shown.values())


@pytest.fixture(scope="module")
def params_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp("api") / "params"
  hf_io.save_params_dir(out, CFG, random_params(CFG))
  return out


def test_load_a_params_dir_in_the_dtype_asked_for(params_dir):
  m = bert_jax.load(str(params_dir), dtype="bfloat16")
  assert m.config.dtype == "bfloat16" and m.config.hidden_size == 12
  leaf = jax.tree.leaves(m.params)[0]
  assert leaf.dtype == np.float32  # the weights keep their stored dtype
  assert leaf.devices() == {jax.devices()[0]}
  assert bert_jax.load(str(params_dir), dtype=np.float16).config.dtype == "float16"


def test_a_bad_dtype_is_one_line(params_dir):
  with pytest.raises(ValueError, match=r"^dtype must be one of float32, bfloat16, float16 .*'x'"):
    bert_jax.load(str(params_dir), dtype="x")
