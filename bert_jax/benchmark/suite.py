"""The interleaved suite: ours in each dtype and variant, then each peer, size by size, pass by
pass, each in a fresh interpreter, so the ratios of one pass are taken under the same machine
conditions; and the JSON-lines output."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from bert_jax.benchmark import measure, peers


def emit(rec: dict[str, Any], json_out: str | None) -> None:
  """One JSON line on stdout, appended to `json_out` too when given."""
  line = json.dumps(rec, sort_keys=True)
  print(line, flush=True)
  if json_out:
    with open(json_out, "a") as f:
      f.write(line + "\n")


def parse_value(text: str) -> Any:
  """'True' -> True, '0' -> 0, '0.1' -> 0.1, anything else stays a string."""
  if text in ("True", "False"):
    return text == "True"
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return text


def parse_variants(text: str) -> list[dict[str, Any]]:
  """'scan_layers=True,remat_policy=full;kernels=xla' -> list of dicts ('' -> none)."""
  out = []
  for part in text.split(";"):
    if not part.strip():
      continue
    v: dict[str, Any] = {}
    for item in filter(None, part.split(",")):
      if "=" not in item:
        raise ValueError(f"--variants item {item!r} is not key=value")
      k, val = item.split("=", 1)
      v[k] = parse_value(val)
    out.append(v)
  return out


def run_suite(
  sizes: Sequence[str],
  seqs: Sequence[int],
  batch: int,
  dtypes: Sequence[str],
  passes: int,
  steps: int,
  warmup: int,
  peer_list: Sequence[tuple[str, str]] = (),
  peer_python: str | None = None,
  variants: Sequence[dict[str, Any]] = ({},),
  json_out: str | None = None,
  isolate: bool = True,
  task: str = "pretrain",
) -> list[dict[str, Any]]:
  """All measurements of `task`'s train step ("pretrain" or "finetune"), interleaved: pass ->
  seq -> size -> (ours..., peers...). A measurement that fails becomes an "error" record; the
  others go on."""
  records = []
  for p in range(passes):
    for seq in seqs:
      for size in sizes:
        jobs = [("ours", dt, v) for v in variants for dt in dtypes]
        jobs += [(fw, dt, {}) for fw, dt in peer_list]
        for impl, dtype, variant in jobs:
          t0 = time.perf_counter()
          try:
            if impl == "ours":
              spec = dict(
                size=size, seq=seq, batch=batch, dtype=dtype, steps=steps, warmup=warmup,
                variant=variant, task=task,
              )  # fmt: skip
              rec = measure.measure_ours_isolated(spec) if isolate else measure.measure_ours(**spec)
            else:
              rec = peers.measure_peer(
                peer_python, impl, dtype, size, seq, batch, steps, warmup, task=task
              )
          except (RuntimeError, subprocess.TimeoutExpired) as e:
            rec = {
              "kind": "error",
              "task": task,
              "impl": impl,
              "size": size,
              "seq": seq,
              "dtype": dtype,
              "variant": variant,
              "error": str(e)[-500:],
            }
          rec["pass"] = p
          rec["wall_s"] = time.perf_counter() - t0
          records.append(rec)
          emit(rec, json_out)
  return records
