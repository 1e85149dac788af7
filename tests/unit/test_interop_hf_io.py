"""bert_jax.interop.hf_io: HuggingFace directories (config.json + model.safetensors) and our
params dirs (bert_config.json + params.safetensors [+ task.json, tokenizer/]) written and read
back with identical arrays; one-line errors for what cannot be read."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file
from tiny_models import CFG, random_params

from bert_jax import params_tree
from bert_jax.interop import hf_io
from bert_jax.trees import flatten


def _assert_same(a, b):
  fa, fb = flatten(a), flatten(b)
  assert set(fa) == set(fb)
  for k in fa:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


def test_save_hf_then_load_hf_gives_the_same_params_and_config(tmp_path):
  params = random_params(CFG)
  hf_io.save_hf(tmp_path / "hf", CFG, params)
  config = json.loads((tmp_path / "hf" / hf_io.HF_CONFIG).read_text())
  assert config["architectures"] == ["BertForPreTraining"]
  assert "cls.predictions.decoder.weight" not in load_file(tmp_path / "hf" / hf_io.HF_WEIGHTS)
  cfg, back = hf_io.load_hf(tmp_path / "hf")
  assert (cfg.hidden_size, cfg.num_layers, cfg.vocab_size) == (12, 2, 40)
  _assert_same(back, params)


def test_save_hf_refuses_an_existing_directory_without_overwrite(tmp_path):
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "keep.txt").write_text("x")
  with pytest.raises((FileExistsError, ValueError)) as e:
    hf_io.save_hf(tmp_path / "hf", CFG, random_params(CFG))
  assert "\n" not in str(e.value)
  assert (tmp_path / "hf" / "keep.txt").read_text() == "x"


def test_params_dir_round_trip_keeps_a_fine_tuned_head_and_its_task(tmp_path):
  bert = random_params(CFG, pretraining=False)
  head = {"classifier": {"kernel": np.ones((12, 3), np.float32), "bias": np.arange(3.0)}}
  task = {"kind": "classification", "labels": ["a", "b", "c"], "task": "t", "max_seq_length": 16}
  hf_io.save_params_dir(tmp_path / "p", CFG, {"bert": bert, "head": head}, task=task)
  assert hf_io.read_task(tmp_path / "p") == task
  cfg, back = hf_io.load_params_dir(tmp_path / "p")
  assert not cfg.scan_layers
  _assert_same(back, {"bert": bert, "head": head})
  cfg, scanned = hf_io.load_params_dir(tmp_path / "p", scan_layers=True)
  assert cfg.scan_layers and params_tree.is_scanned(scanned)


def test_a_head_without_its_task_is_refused_before_anything_is_written(tmp_path):
  bert = random_params(CFG, pretraining=False)
  head = {"classifier": {"kernel": np.ones((12, 2), np.float32), "bias": np.zeros(2)}}
  with pytest.raises(ValueError, match="missing; params has a 'head', which needs its task"):
    hf_io.save_params_dir(tmp_path / "p", CFG, {"bert": bert, "head": head})
  assert not (tmp_path / "p").exists()


def test_a_pretraining_params_dir_has_no_task(tmp_path):
  hf_io.save_params_dir(tmp_path / "p", CFG, random_params(CFG))
  assert hf_io.read_task(tmp_path / "p") is None
  _, back = hf_io.load_params_dir(tmp_path / "p")
  assert params_tree.is_pretraining(back)


def test_a_directory_without_weights_is_one_line(tmp_path):
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / hf_io.HF_CONFIG).write_text(json.dumps({"model_type": "bert"}))
  with pytest.raises((FileNotFoundError, ValueError)) as e:
    hf_io.read_hf_state_dict(tmp_path / "hf")
  assert str(tmp_path / "hf") in str(e.value) and "\n" not in str(e.value)
