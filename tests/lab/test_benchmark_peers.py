"""bert_jax.benchmark.peers: the PyTorch peers time a fresh BERT and a fresh classifier; fine-tuning
peers are PyTorch only."""

import math

import pytest

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax.benchmark import (
  host,
  peers,
  sizes,
)
from lab._benchmark import _peer_python


def test_torch_peer_times_a_fresh_bert():
  python = _peer_python()
  if python is None:
    pytest.skip("no interpreter with torch and transformers (set BERT_JAX_PEER_PYTHON)")
  rec = peers.measure_peer(python, "torch", "float32", "tiny", 32, 2, steps=2, warmup=1)
  assert rec["impl"] == "torch" and rec["size"] == "tiny" and len(rec["step_s"]) == 2
  assert len(rec["losses"]) == 3 and "torch" in rec["versions"]
  # HF's loss: MLM over the vocab + NSP, ~ ln(V) + ln(2) for a fresh model.
  cfg = model_config.config_for_size("tiny")
  assert abs(rec["losses"][0] - (math.log(cfg.vocab_size) + math.log(2))) < 0.5
  # The peers' FLOPs count the MLM head at every position.
  assert rec["flops_per_token"] == model_lib.train_flops_per_token(cfg, 32, 32)


def test_torch_finetune_peer_times_a_fresh_classifier():
  python = _peer_python()
  if python is None:
    pytest.skip("no interpreter with torch and transformers (set BERT_JAX_PEER_PYTHON)")
  rec = peers.measure_peer(
    python, "torch", "float32", "tiny", 32, 2, steps=2, warmup=1, task="finetune"
  )
  assert rec["task"] == "finetune" and rec["impl"] == "torch" and len(rec["step_s"]) == 2
  assert rec["versions"]["attn_implementation"] == "sdpa"
  # A fresh 2-way classifier (weights ~ N(0, 0.02)): loss ~ ln 2.
  assert abs(rec["losses"][0] - math.log(2)) < 0.1
  assert rec["flops_per_token"] == sizes.finetune_flops_per_token(sizes.config_for_size("tiny"), 32)
  assert math.isclose(rec["examples_per_s"], 2 / (rec["step_ms_median"] / 1e3), rel_tol=1e-9)


def test_finetune_peers_are_pytorch_only(monkeypatch):
  for bf16 in (False, True):
    monkeypatch.setattr(host, "cpu_has_bf16", lambda bf16=bf16: bf16)
    expected = ["torch:float32", "torch_compile:float32"]
    expected += ["torch:bfloat16", "torch_compile:bfloat16"] if bf16 else []
    assert peers.default_peers("finetune") == expected
    assert "hf_flax:float32" in peers.default_peers()
  spec = peers.peer_spec("torch", "float32", "minilm", 128, 32, task="finetune")
  assert spec["task"] == "finetune" and spec["num_labels"] == 2
  assert (spec["layers"], spec["hidden"], spec["heads"], spec["intermediate"]) == (6, 384, 12, 1536)
