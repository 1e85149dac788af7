"""bert_jax.benchmark.tables: summaries take the best mode and the fastest peer per pass;
fine-tuning counts examples per second."""

from bert_jax.benchmark import (
  step,
  tables,
)


def test_summary_ratios_take_best_mode_and_fastest_peer_per_pass():
  def rec(impl, dtype, tps, p):
    return dict(
      kind="train_step",
      impl=impl,
      size="base",
      seq=128,
      batch=32,
      dtype=dtype,
      variant={},
      tokens_per_s=tps,
      step_ms_min=1,
      step_ms_median=1,
      step_ms_max=1,
      compile_s=1,
      peak_rss_gb=1,
      gflops=1,
      load_avg=0,
      **{"pass": p},
    )

  records = []
  for p, (f32, b16, hf, torch) in enumerate([(100, 120, 50, 80), (90, 100, 60, 100)]):
    records += [
      rec("bert_jax", "float32", f32, p),
      rec("bert_jax", "bfloat16", b16, p),
      rec("hf_flax", "float32", hf, p),
      rec("torch", "bfloat16", torch, p),
    ]
  # A variant measured beside the default does not count as "ours best".
  records.append({**rec("bert_jax", "float32", 1000, 0), "variant": step.PLAIN})
  (s,) = tables.summarize(records)
  assert [e["ratio_vs_fastest_peer"] for e in s["passes"]] == [1.5, 1.0]
  assert [e["ratio_vs_hf_flax_fp32"] for e in s["passes"]] == [120 / 50, 100 / 60]
  assert s["ratio_vs_fastest_peer_min"] == 1.0 and s["ratio_vs_fastest_peer_median"] == 1.25
  assert [e["fastest_peer"] for e in s["passes"]] == ["torch:bfloat16", "torch:bfloat16"]
  table = tables.format_table(records, [s])
  assert "| base | 128 | bert_jax | float32 | kernels=xla | 0 | 1000 |" in table
  assert "| base | 128 | 110 | 1.00 / 1.25 | 1.67 / 2.03 |" in table


def _ft_rec(impl, dtype, examples_per_s, p=0, seq=128):
  return dict(
    kind="train_step", task="finetune", impl=impl, size="minilm", seq=seq, batch=32,
    dtype=dtype, variant={}, tokens_per_s=examples_per_s * seq,
    examples_per_s=examples_per_s, step_ms_min=1, step_ms_median=1, step_ms_max=1,
    compile_s=1, peak_rss_gb=1, gflops=1, load_avg=0, **{"pass": p},
  )  # fmt: skip


def test_finetune_tables_count_examples_per_second():
  records = [
    _ft_rec("bert_jax", "float32", 60),
    _ft_rec("torch", "float32", 20),
    _ft_rec("torch_compile", "float32", 30),
  ]
  # A pretraining record of the same size and seq is summarised apart.
  records.append({**_ft_rec("bert_jax", "float32", 1000), "task": "pretrain"})
  summaries = tables.summarize(records)
  ft = next(s for s in summaries if s["task"] == "finetune")
  assert ft["ratio_vs_fastest_peer_median"] == 2.0 and ft["ours_best_examples_per_s_median"] == 60
  assert ft["passes"][0]["fastest_peer"] == "torch_compile:float32"
  assert next(s for s in summaries if s["task"] == "pretrain")["ours_best_median"] == 128_000
  table = tables.format_table(records[:3], [ft])
  assert "| examples/s |" in table.splitlines()[0]
  assert "| minilm | 128 | torch | float32 | - | 0 | 20.0 |" in table
  assert "| minilm | 128 | 60.0 | 2.00 / 2.00 | - |" in table
  lock = {
    "kind": "lockstep", "task": "finetune", "size": "minilm", "seq": 128, "pass": 0,
    "peer": "torch:float32", "rounds": 3, "ours_examples_per_s": 61.0,
    "peer_examples_per_s": 20.4, "ratio_min": 2.9, "ratio_median": 3.0, "ratio_max": 3.1,
  }  # fmt: skip
  assert "| minilm | 128 | 0 | torch:float32 | 3 | 61.0 | 20.4 | 2.90 / 3.00 / 3.10 |" in (
    tables.format_lockstep([lock])
  )
