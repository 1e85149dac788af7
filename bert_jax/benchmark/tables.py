"""Summaries and markdown tables of the benchmark's records (standard library only)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

SIZES_ORDER = {
  s: i for i, s in enumerate(("tiny", "mini", "minilm", "small", "medium", "base", "large"))
}


def _finetune(records: Sequence[dict[str, Any]]) -> bool:
  """Whether the train steps are fine-tuning ones (a run times one task): their tables count
  examples/s instead of tokens/s (the same ratios: one batch shape per row)."""
  return any(r.get("task") == "finetune" for r in records if r.get("kind") == "train_step")


def summarize_times(times: Sequence[float]) -> dict[str, float]:
  """Median, min and max step time in ms."""
  return {
    "step_ms_median": 1e3 * statistics.median(times),
    "step_ms_min": 1e3 * min(times),
    "step_ms_max": 1e3 * max(times),
  }


def default_variant(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The variant our main measurements used (the first one run)."""
  ours = [r for r in rows if r["impl"] == "bert_jax"]
  return ours[0]["variant"] if ours else {}


def _pass_entry(rows: Sequence[dict[str, Any]], p: int) -> dict[str, Any] | None:
  """One pass of one (size, seq): our best dtype against the fastest peer and HF Flax fp32."""
  main = default_variant(rows)
  ours = [r for r in rows if r["pass"] == p and r["impl"] == "bert_jax" and r["variant"] == main]
  peer = [r for r in rows if r["pass"] == p and r["impl"] != "bert_jax"]
  if not ours:
    return None
  best = max(ours, key=lambda r: r["tokens_per_s"])
  entry = {"pass": p, "ours_best": best["tokens_per_s"], "ours_best_dtype": best["dtype"]}
  entry["ours_best_examples_per_s"] = best["tokens_per_s"] / best["seq"]
  for r in ours:
    entry[f"ours_{r['dtype']}"] = r["tokens_per_s"]
    if "mfu_fp32_peak" in r:
      entry[f"mfu_{r['dtype']}_vs_fp32_peak"] = r["mfu_fp32_peak"]
  if peer:
    fastest = max(peer, key=lambda r: r["tokens_per_s"])
    entry.update(
      fastest_peer=f"{fastest['impl']}:{fastest['dtype']}",
      fastest_peer_tokens_per_s=fastest["tokens_per_s"],
      ratio_vs_fastest_peer=best["tokens_per_s"] / fastest["tokens_per_s"],
    )
    for r in peer:
      entry[f"{r['impl']}_{r['dtype']}"] = r["tokens_per_s"]
    hf = [r for r in peer if r["impl"] == "hf_flax" and r["dtype"] == "float32"]
    if hf:
      entry["ratio_vs_hf_flax_fp32"] = best["tokens_per_s"] / hf[0]["tokens_per_s"]
  return entry


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per (task, size, seq): best of our dtypes vs the fastest peer, per pass and over passes."""
  steps = [r for r in records if r.get("kind") == "train_step"]
  keys = sorted(
    {(r.get("task", "pretrain"), r["size"], r["seq"]) for r in steps},
    key=lambda k: (k[0], k[2], SIZES_ORDER.get(k[1], 99)),
  )
  out = []
  for task, size, seq in keys:
    rows = [
      r
      for r in steps
      if r["size"] == size and r["seq"] == seq and r.get("task", "pretrain") == task
    ]
    per_pass = [e for p in sorted({r["pass"] for r in rows}) if (e := _pass_entry(rows, p))]
    if not per_pass:
      continue
    summary = {"kind": "summary", "task": task, "size": size, "seq": seq, "passes": per_pass}
    for key in (
      "ratio_vs_fastest_peer",
      "ratio_vs_hf_flax_fp32",
      "ours_best",
      "ours_best_examples_per_s",
      "mfu_float32_vs_fp32_peak",
    ):
      vals = [e[key] for e in per_pass if key in e]
      if vals:
        summary[f"{key}_min"] = min(vals)
        summary[f"{key}_median"] = statistics.median(vals)
    out.append(summary)
  return out


def format_table(records: Sequence[dict[str, Any]], summaries: Sequence[dict[str, Any]]) -> str:
  """Every train-step record, then the summaries (fine-tuning steps: examples/s)."""
  finetune = _finetune(records)
  unit = "examples/s" if finetune else "tokens/s"
  best_key = "ours_best_examples_per_s_median" if finetune else "ours_best_median"
  rate = ".1f" if finetune else ".0f"  # tens of examples/s, tens of thousands of tokens/s
  lines = [
    f"| size | seq | impl | dtype | variant | pass | {unit} | step ms (min/med/max) | "
    "compile s | peak RSS GB | GFLOP/s | MFU vs fp32 peak | load |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in records:
    if r.get("kind") != "train_step":
      continue
    var = ",".join(f"{k}={v}" for k, v in r["variant"].items()) or "-"
    mfu = f"{r['mfu_fp32_peak']:.2f}" if "mfu_fp32_peak" in r else ""
    lines.append(
      f"| {r['size']} | {r['seq']} | {r['impl']} | {r['dtype']} | {var} | {r['pass']} | "
      f"{r['tokens_per_s'] / (r['seq'] if finetune else 1):{rate}} | "
      f"{r['step_ms_min']:.0f} / {r['step_ms_median']:.0f} / "
      f"{r['step_ms_max']:.0f} | {r['compile_s']:.1f} | {r['peak_rss_gb']:.2f} | "
      f"{r['gflops']:.0f} | {mfu} | {r['load_avg']:.1f} |"
    )
  if summaries:
    lines += [
      "",
      f"| size | seq | ours best {unit} (med) | vs fastest peer (min / med) | "
      "vs HF Flax fp32 (min / med) | MFU fp32 (med) |",
      "|---|---|---|---|---|---|",
    ]
    for s in summaries:

      def pair(k: str, s: dict[str, Any] = s) -> str:
        return f"{s[k + '_min']:.2f} / {s[k + '_median']:.2f}" if k + "_min" in s else "-"

      mfu = s.get("mfu_float32_vs_fp32_peak_median")
      lines.append(
        f"| {s['size']} | {s['seq']} | {s[best_key]:{rate}} | "
        f"{pair('ratio_vs_fastest_peer')} | {pair('ratio_vs_hf_flax_fp32')} | "
        f"{'' if mfu is None else f'{mfu:.2f}'} |"
      )
  return "\n".join(lines)


def format_lockstep(records: Sequence[dict[str, Any]]) -> str:
  """The lockstep ratios: ours tokens/s (fine-tuning: examples/s) over the peer's, per round."""
  rows = [r for r in records if r.get("kind") == "lockstep"]
  unit = "ex" if any(r.get("task") == "finetune" for r in rows) else "tok"
  lines = [
    f"| size | seq | pass | peer | rounds | ours {unit}/s (med) | peer {unit}/s (med) | "
    "ours / peer per round (min / med / max) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  key, rate = ("examples_per_s", ".1f") if unit == "ex" else ("tokens_per_s", ".0f")
  for r in rows:
    lines.append(
      f"| {r['size']} | {r['seq']} | {r['pass']} | {r['peer']} | {r['rounds']} | "
      f"{r['ours_' + key]:{rate}} | {r['peer_' + key]:{rate}} | "
      f"{r['ratio_min']:.2f} / {r['ratio_median']:.2f} / {r['ratio_max']:.2f} |"
    )
  return "\n".join(lines)
