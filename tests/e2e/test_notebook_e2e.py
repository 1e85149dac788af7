"""notebooks/probe_a_checkpoint.ipynb runs end to end on a real checkpoint: every code cell in
order, as Jupyter would, on a workdir a real trainer process made."""

import json
import pathlib
import subprocess

import matplotlib
import numpy as np
import pytest
from unit.test_train import _env, _main_cmd

from bert_jax import api

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "probe_a_checkpoint.ipynb"


@pytest.mark.slow
def test_notebook_runs_on_a_trained_workdir(tiny_data_dir, tmp_path, monkeypatch):
  wd = tmp_path / "wd"
  r = subprocess.run(_main_cmd(wd, tiny_data_dir, 2), env=_env(), capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  monkeypatch.setenv("BERT_JAX_WORKDIR", str(wd))
  matplotlib.use("Agg")
  cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
  assert len(cells) == 4
  ns: dict = {}
  for cell in cells:
    exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), ns)
  assert isinstance(ns["m"], api.Bert) and ns["m"].step == 2
  assert [len(p) for p in ns["preds"]] == [1, 1]  # one [MASK] per text
  assert all(len(g) == 5 and 0 < g[0][1] <= 1 for p in ns["preds"] for g in p)
  sim = ns["similarity"]
  assert sim.shape == (3, 3)
  np.testing.assert_allclose(np.diag(sim), 1.0, rtol=1e-5)
  tokens, probs = ns["tokens"], ns["probs"]
  assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
  assert probs.shape == (ns["m"].config.num_heads, len(tokens), len(tokens))
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-4)  # rows are distributions
  assert len(ns["fig"].axes) == ns["m"].config.num_heads
