"""bert_jax.report.verdicts: one table of verdicts across the experiments, each line judged once."""

import subprocess
import sys

import pytest

from unit._report_runs import T5, _config, _seeded_root, _write_run


def test_verdicts_across_experiments_judge_every_line_once(tmp_path):
  from bert_jax.report import stats, verdicts

  _seeded_root(tmp_path / "table5", T5, baseline=0.508)
  # Table 6 shares Table 5's baseline and control (the same values): their lines come once.
  sizes = {
    "row=tiny": (_config(True, True, False), [40.0, 42.0, 41.0], T5["task=mlm_nsp"][2]),
    "row=L2_H256_A4": (
      {**_config(True, True, False), "model": {"num_layers": 2, "hidden_size": 256}},
      [30.0, 31.0, 32.0], [[0.9, 0.9], [0.91, 0.91], [0.92, 0.92]],
    ),
    "pretraining=none": T5["pretraining=none"],
  }  # fmt: skip
  for cfg in (sizes["row=tiny"][0], sizes["row=L2_H256_A4"][0]):
    cfg["model"].update(vocab_size=100, intermediate_size=4 * cfg["model"]["hidden_size"])
  _seeded_root(tmp_path / "table6", sizes)
  # Pretrained, not fine-tuned yet: listed as missing.
  _write_run(str(tmp_path / "table5"), "task=mlm,seed=3", _config(True, False, False),
             [{"step": 20, "split": "eval", "mlm_perplexity": 40.0}])  # fmt: skip
  md = verdicts.summary(str(tmp_path))
  assert md == open(tmp_path / "report" / "verdicts.md").read().strip()
  rows = [ln for ln in md.splitlines() if ln.startswith("| table")]
  premise = [r for r in rows if "BERT's premise" in r]
  # The control against mlm_nsp, mlm, ltr (table5) and the 256-wide row (table6): the tiny row's
  # line is table5's mlm_nsp line again.
  assert len(premise) == 4 and sum("row=L2_H256_A4 vs pretraining=none" in r for r in premise) == 1
  family = [r for r in rows if not r.split(" | ")[6].startswith("–")]
  assert f"{len(rows)} lines, Holm over all of them" in md and stats.TEST in md
  assert len(family) == len(rows) - 2  # the ltr lines: one pretraining run, no p-value
  size = next(r for r in rows if "bigger is better" in r)
  assert "| row=L2_H256_A4 vs row=tiny | 3 vs 3 | +10.5 [" in size and "**reproduced**" in size
  assert (
    "| rotten_tomatoes (SST-2) accuracy | majority class 50.8 | table6/row=L2_H256_A4: 91.0 "
    "| yes |" in md
  )
  assert "- table5: task=ltr fine-tuned for 1 of 3 pretraining runs" in md
  assert "- table5: task=mlm fine-tuned for 3 of 4 pretraining runs" in md
  with pytest.raises(ValueError, match="none of table5, table6, masking, wwm below it"):
    verdicts.summary(str(tmp_path / "table5"))
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.report", f"--root={tmp_path}", "--verdicts"],
    capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert r.returncode == 0 and r.stdout.startswith("## Verdicts (test split; "), r.stderr
