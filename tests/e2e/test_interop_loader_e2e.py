"""The end-to-end half of tests/unit/test_interop_loader.py (real processes; slow): see its
docstring."""

import jax
import numpy as np
import pytest
from unit import test_interop_loader as unit_interop_loader
from unit._hf_fixture import _one_line, mk
from unit.test_interop_loader import _bert_model_dir

import bert_jax
from bert_jax import train
from bert_jax.interop import loader

# The unit half's fixture, shared here.
nsp_data = unit_interop_loader.nsp_data


@pytest.mark.slow
def test_init_from_bert_model_gets_fresh_heads(nsp_data, tmp_path, capsys):
  src = _bert_model_dir(tmp_path / "bert_model")
  runs = {}
  for name, init in (("scratch", None), ("init", str(src))):
    config = mk.roundtrip_config(data_dir=nsp_data, nsp=True)
    # Step 1 of a warmup starts at learning rate 0: its saved params are the initial ones.
    config.opt.total_steps, config.opt.warmup_steps, config.ckpt.every_steps = 2, 1, 1
    config.init_from = init
    train.train_and_evaluate(config, str(tmp_path / name))
    runs[name] = bert_jax.load(tmp_path / name, step=1).params
  out = capsys.readouterr().out
  assert out.count("has no MLM/NSP heads (a BertModel): they start fresh") == 1
  want = loader.load_checkpoint(src).params  # BertModel tree
  got, scratch = runs["init"], runs["scratch"]
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got["bert"]), want)
  for head in ("predictions", "seq_relationship"):
    jax.tree.map(np.testing.assert_array_equal, got[head], scratch[head])
  m = bert_jax.load(src)  # the notebook API embeds with a BertModel checkpoint ...
  assert not m.has_heads and len(m.embed(["alice"]).hidden) == 1
  with pytest.raises(ValueError) as e:  # ... and says why it cannot fill masks
    m.fill_mask("the [MASK] .")
  _one_line(e, "no MLM head")
