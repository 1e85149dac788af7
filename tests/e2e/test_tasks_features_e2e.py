"""The end-to-end half of tests/unit/test_tasks_features.py (real processes; slow): see its
docstring."""

import json
import os

import numpy as np
import pytest
from unit._finetune_tasks import _splits, tiny_config
from unit.test_tasks_features import cities

from bert_jax import finetune
from bert_jax.interop import hf_io, loader
from bert_jax.tasks import features


@pytest.mark.slow
def test_tagger_learns_on_frozen_features_computed_once(tmp_path, monkeypatch):
  """Two seeds of a weighted sum over both layers of a frozen random encoder: the encoder
  runs once per row for the whole run, the tagger learns, and best/ is a feature head dir."""
  calls = []
  add_features = features.add_features

  def counting(*a):
    calls.append(add_features(*a))
    return calls[-1]

  monkeypatch.setattr(features, "add_features", counting)
  c = tiny_config("tagging", _splits(tmp_path, cities))
  c.features.update(features.ROWS["sum_all"])
  c.features.lstm_layers, c.features.lstm_size = 1, 16
  c.opt.lr, c.data.buckets, c.seeds = 3e-2, (), 2
  wd = tmp_path / "run"
  res = finetune.finetune(c, str(wd))
  for s in res["seeds"]:
    assert s["dev"]["entity_f1"] > 0.9, s  # 0.0 before it learns to tag either city
  # The encoder ran once for the whole run (both seeds, every epoch): one batch of 16 rows
  # at a time over 192 + 64 + 64 rows.
  assert len(calls) == 1
  assert calls[0]["batches"] == 12 + 4 + 4 and calls[0]["rows"] == 320

  best = wd / "seed_0" / "best"
  info, head = features.load_head(str(best))
  assert info["kind"] == "tagging" and info["labels"] == ["B-LOC", "O"]
  assert info["features"]["layers"] == [1, 2] and info["features"]["combine"] == "weighted_sum"
  assert set(head) == {"head"} and head["head"]["scalar_mix"]["gamma"].shape == ()
  mix = head["head"]["scalar_mix"]
  assert np.abs(mix["weights"]).max() > 1e-4 and abs(float(mix["gamma"]) - 1.0) > 1e-4
  assert not os.path.exists(best / hf_io.PARAMS_FILE)
  with pytest.raises(ValueError, match="feature-based head .* has no HuggingFace form") as e:
    loader.convert(str(best), str(tmp_path / "hf"), "auto")
  assert "\n" not in str(e.value)
  assert json.load(open(wd / "results.json"))["config"]["features"]["all_layers"] is True
