r"""The benchmark's command line: `python -m bert_jax.benchmark` (console script
`bert_jax_benchmark`).

It times the trainer's own jitted train step at each size, sequence length and dtype: tokens/s,
model FLOPs and MFU against a matmul peak measured in the same process, compile time and peak
memory; with --peers, HuggingFace Flax and PyTorch (eager and torch.compile) on the same shapes
and batches. Every measurement runs in a fresh interpreter, and a pass interleaves ours and the
peers' size by size, so a pass's ratios share the machine's conditions; --lockstep keeps ours
and one peer in two live processes taking turns of whole steps. bf16 is timed by default only
where the CPU has AVX512-BF16 or AMX (elsewhere it is emulated).

  python -m bert_jax.benchmark --sizes=tiny,mini,small,medium,base --seqs=128 --batch=32 \
      --passes=2 --peers --peer_python=/path/to/venv/bin/python
  python -m bert_jax.benchmark --sizes=tiny,base --peers --lockstep --steps=5 \
      --peer_python=/path/to/venv/bin/python                 # turn by turn
  python -m bert_jax.benchmark --notrain_steps --large  # BERT-Large (scan): compile, memory
  python -m bert_jax.benchmark --notrain_steps --data   # create_data, input pipeline
  python -m bert_jax.benchmark --task=finetune --sizes=minilm,base --seqs=128 --batch=32 \
      --peers --lockstep --peer_python=/path/to/venv/bin/python   # fine-tuning step, examples/s
  python -m bert_jax.benchmark --gpu --json_out=gpu.jsonl   # on a GPU: ours vs PyTorch (gpu.py)
  python -m bert_jax.benchmark --gpu_smoke                  # the same plumbing, tiny, on a CPU

Output: one JSON line per measurement (stdout, and appended to `--json_out`), then tables.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from typing import Any

from absl import flags

from bert_jax import cli
from bert_jax.benchmark import (
  data,
  gpu,
  gpu_ours,
  host,
  lockstep,
  measure,
  memory,
  peers,
  protocol,
  sizes,
  suite,
  tables,
)

_TASK = flags.DEFINE_enum(
  "task",
  "pretrain",
  peers.TASKS,
  "The train step timed: pretraining (MLM + NSP), or fine-tuning (the fine-tuning engine's "
  "2-way sequence classification step; peers: transformers' PyTorch "
  "BertForSequenceClassification, eager and torch.compile), reported in examples/s.",
)
_SIZES = flags.DEFINE_list(
  "sizes",
  ["tiny", "mini", "small", "medium", "base"],
  "Model sizes (bert_jax.model_config.SIZES, and 'minilm': 6 layers, hidden 384, 12 heads).",
)
_SEQS = flags.DEFINE_list("seqs", ["128"], "Sequence lengths.")
cli.check_flag(_SIZES, lambda names: [sizes.size_fields(s) for s in names])
cli.check_flag(_SEQS, lambda seqs: [_seq(s) for s in seqs])
_BATCH = flags.DEFINE_integer("batch", 32, "Global batch (sequences).")
_DTYPES = flags.DEFINE_list(
  "dtypes",
  None,
  "Our compute dtypes; params stay fp32 (default: float32, and bfloat16 when the CPU has "
  "AVX512-BF16 or AMX).",
)
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per measurement (the median is reported).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps first (the first compiles).")
_PASSES = flags.DEFINE_integer("passes", 2, "Interleaved passes over everything.")
_VARIANTS = flags.DEFINE_string(
  "variants",
  "",
  "Extra model-field variants of ours, ';'-separated k=v,k=v lists (e.g. kernels=xla for the "
  "stock XLA ops); the first measurement is always the trainer's default. With --gpu they "
  "replace the default variants (`--variants=`: none); there `xla_*` keys are XLA options of "
  "that executable, and `side=torch,attention_dropout_prob=0` is a PyTorch variant.",
)
_PEERS = flags.DEFINE_bool("peers", False, "Also time HF Flax / PyTorch BertForPreTraining steps.")
_PEER_PYTHON = flags.DEFINE_string(
  "peer_python", None, "Interpreter with torch/transformers (default: this one)."
)
_PEER_LIST = flags.DEFINE_list(
  "peer_list",
  None,
  "framework:dtype peers to time (default: each peer in fp32, and in bf16 when the CPU has "
  "AVX512-BF16 or AMX).",
)
_ISOLATE = flags.DEFINE_bool("isolate", True, "Each of our measurements in a fresh process.")
_LOCKSTEP = flags.DEFINE_bool(
  "lockstep",
  False,
  "With --peers: keep our step and each peer's (one peer at a time) in live processes and "
  "alternate turns of whole steps, --steps rounds per peer; reports the ratio round by round. "
  "Our first --dtypes only (default: bfloat16 on a CPU with bf16 instructions, else float32), "
  "trainer's default model.",
)
_TURN_S = flags.DEFINE_float(
  "lockstep_turn_s", 3.0, "--lockstep: a turn times whole steps this long."
)
_SETTLE = flags.DEFINE_integer(
  "lockstep_settle", 1, "--lockstep: untimed steps that open each turn (after a switch)."
)
_THP_MALLOC = flags.DEFINE_bool(
  "thp_malloc",
  True,
  "Run every measured process (ours and the peers alike) with glibc's malloc on transparent "
  f"huge pages ({host.THP_TUNABLE} in GLIBC_TUNABLES) when the kernel offers them; needs "
  "--isolate (in-process measurements keep the malloc this process started with).",
)
_LARGE = flags.DEFINE_bool("large", False, "BERT-Large (scan): compile time and step memory.")
_LARGE_BATCH = flags.DEFINE_integer("large_batch", 8, "Batch of the --large step.")
_DATA = flags.DEFINE_bool("data", False, "Time create_data and the input pipeline.")
_TRAIN_STEPS = flags.DEFINE_bool("train_steps", True, "Run the train-step suite.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also append the JSON lines to this file.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: run one measurement (JSON spec) and exit.")
_GPU = flags.DEFINE_bool(
  "gpu",
  False,
  "The GPU comparison (docs/gpu.md): ours (pretraining at Base/Large 128 x 256 and Large "
  "512 x 64 by default, --shapes, and --variants) against transformers' PyTorch BERT eager and "
  "torch.compile on the same GPU, the bf16 matmul on both sides, both sides' profiles "
  "(--profile), each side's cold build of one shape alone (--compile_alone), within "
  "--deadline. --sizes, --seqs, --batch, --dtypes, --task and --peers do not apply.",
)
_GPU_SMOKE = flags.DEFINE_bool(
  "gpu_smoke", False, "--gpu's plumbing at tiny shapes; runs on a CPU (both sides on it)."
)
_DEADLINE = flags.DEFINE_float(
  "deadline",
  500.0,
  "--gpu: seconds for the whole comparison; what does not fit (by the planned estimates) is "
  "skipped and reported, variants first.",
)
_SHAPES = flags.DEFINE_list(
  "shapes",
  None,
  "--gpu: the shapes, in priority order (default base128,large128,large512; also ft_base128; "
  "--gpu_smoke: tiny128,tiny64,ft_tiny128). Variants go to the first unless they move.",
)
_PROFILE = flags.DEFINE_list(
  "profile",
  None,
  "--gpu: shapes whose step is traced for one step, ours (jax.profiler) and PyTorch's "
  "(torch.profiler, torch.compile's where it runs), and tabled by kernel family side by side "
  "(default: base128 and large512 where among --shapes, else the first shape; empty for none).",
)
_PROFILE_DIR = flags.DEFINE_string(
  "profile_dir",
  None,
  "--gpu: write each profile's Chrome trace here, as ours-SHAPE.trace.json.gz and "
  "torch-SHAPE.trace.json.gz.",
)
_COMPILE_ALONE = flags.DEFINE_string(
  "compile_alone",
  None,
  "--gpu: the shape whose cold build each side makes with nothing else compiling or running, "
  "ours first, then torch.compile's (default large128 where among --shapes; --gpu_smoke: "
  "tiny64; empty for none).",
)
_DRY_RUN = flags.DEFINE_bool(
  "dry_run",
  False,
  "--gpu: print the plan (what is admitted in which order, the planned build schedule and "
  "timing phases against --deadline) and exit; starts no worker.",
)
_REPS = flags.DEFINE_integer(
  "reps", 3, "--gpu: timed runs of --steps back-to-back steps per step (the fastest counts)."
)
_COMPILE_THREADS = flags.DEFINE_integer(
  "compile_threads", 3, "--gpu: our steps compiled at once (XLA compiles in threads)."
)
_TORCH_MODES = flags.DEFINE_list(
  "torch_modes",
  ["eager", "compile"],
  "--gpu: the PyTorch peers' modes (eager, compile); empty for ours alone.",
)
_GPU_WORKER = flags.DEFINE_string("gpu_worker", None, "Internal: our side of --gpu (JSON spec).")


def _seq(text: str) -> int:
  if not text.strip().isdigit() or int(text) < 1:
    raise ValueError(f"--seqs: {text!r} is not a sequence length (a positive integer)")
  return int(text)


def _peer_list(peer_python: str) -> list[tuple[str, str]]:
  """--peer_list (or the default peers) that `peer_python` can run; the others are skipped
  with a note."""
  if _PEER_PYTHON.value and not os.path.exists(_PEER_PYTHON.value):
    raise FileNotFoundError(f"--peer_python: {_PEER_PYTHON.value} does not exist")
  ok = peers.peer_available(peer_python)
  out = []
  frameworks = peers.FINETUNE_FRAMEWORKS if _TASK.value == "finetune" else peers.FRAMEWORKS
  for item in _PEER_LIST.value or peers.default_peers(_TASK.value):
    fw, _, dt = item.partition(":")
    if fw not in frameworks:
      raise ValueError(
        f"--peer_list: unknown peer {fw!r} for --task={_TASK.value}; use {', '.join(frameworks)}"
      )
    if ok[fw]:
      out.append((fw, dt or "float32"))
    else:
      print(f"benchmark: peer {fw} is not importable in {peer_python}; skipped", file=sys.stderr)
  return out


def _lockstep_all(seqs: list[int], peer_list, peer_python: str) -> list[dict[str, Any]]:
  dtype = lockstep.lockstep_dtype(_DTYPES.value)
  records = []
  for p, seq, size in itertools.product(range(_PASSES.value), seqs, _SIZES.value):
    t0 = time.perf_counter()
    try:
      recs = lockstep.measure_lockstep(
        size, seq, _BATCH.value, dtype, _STEPS.value, _WARMUP.value, peer_list, peer_python,
        min_turn_s=_TURN_S.value, settle_steps=_SETTLE.value, task=_TASK.value,
      )  # fmt: skip
    except RuntimeError as e:
      recs = [{"kind": "error", "impl": "bert_jax", "size": size, "seq": seq, "error": str(e)}]
    for rec in recs:
      rec.update({"pass": p, "wall_s": time.perf_counter() - t0})
      suite.emit(rec, _JSON_OUT.value)
    records += recs
  return records


def _gpu() -> None:
  smoke = _GPU_SMOKE.value
  present = lambda name: flags.FLAGS[name].present  # noqa: E731
  records = gpu.run_gpu(
    smoke=smoke,
    deadline_s=_DEADLINE.value,
    # --variants= (given, empty) means none; not given, the default list.
    variants=suite.parse_variants(_VARIANTS.value) if present("variants") else None,
    torch_modes=_TORCH_MODES.value,
    steps=_STEPS.value if present("steps") else (2 if smoke else 10),
    reps=_REPS.value,
    warmup=_WARMUP.value if present("warmup") else 3,
    compile_threads=_COMPILE_THREADS.value,
    peer_python=_PEER_PYTHON.value or sys.executable,
    json_out=_JSON_OUT.value,
    shapes=_SHAPES.value,
    profile=_PROFILE.value,
    profile_dir=_PROFILE_DIR.value,
    dry_run=_DRY_RUN.value,
    alone=_COMPILE_ALONE.value,
  )
  if not _DRY_RUN.value:
    print("\n" + gpu.format_gpu_table(records))


def main(argv: list[str]) -> None:
  del argv
  if _WORKER.value:
    protocol.print_result(measure.measure_ours(**json.loads(_WORKER.value)))
    return
  if _GPU_WORKER.value:
    gpu_ours.session(json.loads(_GPU_WORKER.value))
    return
  if _GPU.value or _GPU_SMOKE.value:
    _gpu()
    return
  seqs = [_seq(s) for s in _SEQS.value]
  variants = [{}] + (suite.parse_variants(_VARIANTS.value) if _VARIANTS.value else [])
  peer_python = _PEER_PYTHON.value or sys.executable
  peer_list = _peer_list(peer_python) if _PEERS.value else []
  if _LOCKSTEP.value and not (peer_list and _ISOLATE.value):
    raise ValueError("--lockstep needs --peers (with an importable peer) and --isolate")
  # Children inherit it: the peers, and ours only when isolated, so only then (both alike).
  if _THP_MALLOC.value and _ISOLATE.value:
    os.environ.update(host.with_thp_malloc(dict(os.environ)))
  suite.emit({**host.host_record(), "python": sys.version.split()[0]}, _JSON_OUT.value)
  records: list[dict[str, Any]] = []
  if _TRAIN_STEPS.value and _SIZES.value and _LOCKSTEP.value:
    records = _lockstep_all(seqs, peer_list, peer_python)
  elif _TRAIN_STEPS.value and _SIZES.value:
    records = suite.run_suite(
      _SIZES.value,
      seqs,
      _BATCH.value,
      _DTYPES.value or host.default_dtypes(),
      _PASSES.value,
      _STEPS.value,
      _WARMUP.value,
      peer_list,
      peer_python,
      variants,
      _JSON_OUT.value,
      _ISOLATE.value,
      _TASK.value,
    )
  if _LARGE.value:
    spec = memory.large_spec(_LARGE_BATCH.value)
    rec = measure.measure_ours_isolated(spec) if _ISOLATE.value else measure.measure_ours(**spec)
    suite.emit({**rec, "kind": "large"}, _JSON_OUT.value)
  if _DATA.value:
    suite.emit(data.measure_data(seqs[0]), _JSON_OUT.value)
  summaries = tables.summarize(records)
  for s in summaries:
    suite.emit(s, _JSON_OUT.value)
  if records:
    print(tables.format_table(records, summaries))
  if any(r.get("kind") == "lockstep" for r in records):
    print("\n" + tables.format_lockstep(records))


def run() -> None:
  cli.run(main, "benchmark", compilation_cache=True)


if __name__ == "__main__":
  run()
