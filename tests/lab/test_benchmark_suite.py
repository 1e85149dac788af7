"""bert_jax.benchmark.suite: a tiny run emits well-formed JSON, --variants parses typed values."""

import json
import math
import os

import pytest

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax.benchmark import (
  step,
  suite,
  tables,
)


@pytest.mark.slow
def test_tiny_run_emits_sane_json(tmp_path):
  out = tmp_path / "bench.jsonl"
  records = suite.run_suite(
    ["tiny"],
    [64],
    batch=4,
    dtypes=["float32"],
    passes=1,
    steps=2,
    warmup=1,
    json_out=str(out),
    isolate=False,
  )
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  assert lines == json.loads(json.dumps(records))
  (r,) = lines
  assert r["kind"] == "train_step" and r["impl"] == "bert_jax" and r["size"] == "tiny"
  assert r["variant"] == {} and r["kernels"] == "cpu"  # the trainer's default on CPU
  assert r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
  assert math.isclose(r["tokens_per_s"], 4 * 64 / (r["step_ms_median"] / 1e3), rel_tol=1e-9)
  cfg = model_config.config_for_size("tiny")
  # MLM head at max_predictions(64) = 10 gathered positions, not at all 64.
  assert r["flops_per_token"] == model_lib.train_flops_per_token(cfg, 64, 10)
  assert math.isclose(r["gflops"], r["flops_per_token"] * r["tokens_per_s"] / 1e9, rel_tol=1e-9)
  assert 0 < r["mfu"] == r["mfu_fp32_peak"] < 1.5 and r["peak_gflops"]["float32"] > 1
  assert r["compile_s"] > 0 and 0.1 < r["peak_rss_gb"] < 24
  assert r["page_faults_per_step"] >= 0
  assert r["glibc_tunables"] == os.environ.get("GLIBC_TUNABLES", "")  # what this process read
  # Three steps (1 warm-up + 2 timed) of a fresh model: loss ~ ln(V) + ln(2), decreasing.
  assert len(r["losses"]) == 3
  assert abs(r["losses"][0] - (math.log(cfg.vocab_size) + math.log(2))) < 0.5
  summary = tables.summarize(records)
  assert summary[0]["ours_best_median"] == r["tokens_per_s"]
  table = tables.format_table(records, summary)
  assert "| tiny | 64 | bert_jax | float32 | - |" in table


def test_parse_variants_types_values():
  got = suite.parse_variants(
    "scan_layers=True,remat_policy=full;hidden_dropout_prob=0.0,num_layers=3"
  )
  assert got == [
    {"scan_layers": True, "remat_policy": "full"},
    {"hidden_dropout_prob": 0.0, "num_layers": 3},
  ]
  assert isinstance(got[1]["num_layers"], int) and isinstance(got[1]["hidden_dropout_prob"], float)
  assert suite.parse_variants("kernels=xla") == [step.PLAIN]
  with pytest.raises(ValueError, match="not key=value"):
    suite.parse_variants("scan_layers")
