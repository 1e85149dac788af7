"""Benchmark of the trainer's own jitted train step, side by side with HuggingFace/PyTorch.

  python -m bert_jax.benchmark --sizes=tiny,mini,small,medium,base --seqs=128 --batch=32 \
      --passes=2 --peers --peer_python=/path/to/venv/bin/python
  python -m bert_jax.benchmark --sizes=base --peers --lockstep --steps=5  # turn by turn
  python -m bert_jax.benchmark --large        # BERT-Large (scan): compile time, step memory
  python -m bert_jax.benchmark --data         # create_data and input-pipeline throughput
  python -m bert_jax.benchmark --loss_check   # fast vs plain configuration: same losses

Every measurement runs in a fresh interpreter (so compile time and peak RSS are its own) and
the measurements of one pass are interleaved: ours, then each peer, size by size, pass by
pass, so ratios are taken under the same machine conditions. A measurement is the median step
time of `--steps` timed steps after `--warmup` untimed ones (the first one compiles), on a
synthetic full-length batch reused every step. Our step is `train.make_train_step` jitted
exactly as `train.train_and_evaluate` does (state donated, on-device masking included); MFU
divides the model FLOPs (`model.train_flops_per_token`: attention included, the MLM head at
the `max_predictions` gathered positions, the pruned last layer at the positions it computes)
by a matmul peak measured in the same process
(the best of 7 square matmuls, before and after the timed steps).

With `--lockstep` (and `--peers`) the comparison is finer: our step and each peer's stay
compiled in live processes (one peer at a time beside ours) and take turns of whole steps,
`--steps` rounds per peer, and each round gives its own ratio. On a shared host whose speed
drifts over minutes, this keeps the two sides of a ratio seconds apart instead of minutes.

Every measured process, ours and the peers', starts with glibc's malloc on transparent huge
pages (`--thp_malloc`, on by default where the kernel offers THP): each step allocates its
activations afresh, and 4 KB pages made that cost a BERT-Base step 1.3M page faults (see
THP_TUNABLE). With `--noisolate` ours run in this process with the malloc it started with,
and so do the peers (the setting is then not applied to anyone).

Peers (`--peers`): transformers 4.x `FlaxBertForPreTraining` (fp32) and PyTorch
`BertForPreTraining` (eager and torch.compile, fp32 and bf16 autocast), with AdamW and
dropout 0.1 on the same shapes. bf16 (ours and the peers') is timed by default only when the
CPU has AVX512-BF16 or AMX; elsewhere it is emulated and far slower. The peers' MLM head
computes logits at every position, as HuggingFace does. They run in `--peer_python` (an
interpreter that has torch/transformers), or in this one if it can import them.

Output: one JSON line per measurement (stdout, and appended to `--json_out`) and a table.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

SIZES_DEFAULT = ("tiny", "mini", "small", "medium", "base")
# Predicted positions per sequence by length (the original BERT's two phases).
MAX_PREDICTIONS = {128: 20, 512: 80}
# Each peer in the precisions this CPU runs natively: bf16 only with AVX512-BF16 or AMX (on a
# Zen 3 without them torch's emulated bf16 step was 12x slower than fp32 for BERT-tiny).
PEERS_FP32 = ("hf_flax:float32", "torch:float32", "torch_compile:float32")
PEERS_BF16 = ("torch:bfloat16", "torch_compile:bfloat16")


def _read_text(path: str) -> str:
  """A (Linux /proc or /sys) file's text; "" where it cannot be read."""
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ""


def cpu_has_bf16() -> bool:
  """Whether this (Linux x86) CPU has bf16 matmul instructions (AVX512-BF16 or AMX-BF16)."""
  flags = _read_text("/proc/cpuinfo")
  return "avx512_bf16" in flags or "amx_bf16" in flags


def default_peers() -> list[str]:
  return list(PEERS_FP32 + (PEERS_BF16 if cpu_has_bf16() else ()))


def default_dtypes() -> list[str]:
  """Our compute dtypes by the same rule as default_peers."""
  return ["float32", "bfloat16"] if cpu_has_bf16() else ["float32"]


def lockstep_dtype(dtypes: Sequence[str] | None) -> str:
  """The one dtype --lockstep times: the first of `dtypes`, else our fast mode on this CPU
  (bf16 where it has bf16 instructions: faster at every size on a Zen 4; else float32)."""
  return dtypes[0] if dtypes else default_dtypes()[-1]


_RESULT_MARK = "BENCH_RESULT "
_READY_MARK = "BENCH_READY"
_STEP_MARK = "BENCH_STEP "


def _lockstep_serve(run_one) -> list[float]:
  """Lockstep worker loop: after "BENCH_READY", one step (`run_one()` -> seconds) per "step"
  or "settle" line on stdin, each answered with a "BENCH_STEP <seconds>" line, until any other
  line. Returns the times of the "step" steps ("settle" ones are not measurements).
  Also runs in the peer interpreter (from its source text), so it uses only the stdlib."""
  import json
  import sys

  print("BENCH_READY", flush=True)
  times = []
  for line in sys.stdin:
    cmd = line.strip()
    if cmd not in ("step", "settle"):
      break
    t = run_one()
    if cmd == "step":
      times.append(t)
    print("BENCH_STEP " + json.dumps(t), flush=True)
  return times


# Model-field settings of the fast path and of the plain reference (for --loss_check).
FAST: dict[str, Any] = {"attention_impl": "fused", "prune_last_layer": True, "matmul_vjp": True}
PLAIN: dict[str, Any] = {
  "attention_impl": "explicit",
  "scan_layers": False,
  "remat_policy": "none",
  "fuse_qkv": False,
  "dropout_rng": "threefry",
  "prune_last_layer": False,
  "matmul_vjp": False,
}
# --loss_check compares with PLAIN both the timed configuration (unrolled layers, so the last
# layer is pruned to the masked positions) and the optional paths (scan + remat, fused q/k/v).
FAST_CHECK: dict[str, Any] = {**FAST, "scan_layers": True, "remat_policy": "full", "fuse_qkv": True}
LOSS_CHECKS: dict[str, dict[str, Any]] = {"fast": FAST, "fast_scan": FAST_CHECK}


# ----------------------------------------------------------------------------- helpers


# glibc's malloc tunable that backs its blocks with transparent huge pages. XLA:CPU (and
# PyTorch) allocate a step's activations afresh each step; with 4 KB pages a BERT-Base step
# (batch 32 x 128) took 1.3M page faults, 8.2 s of kernel time and 27.8 s; with huge pages
# 3.5k faults, 2.8 s and 24.3 s. The peers gain from it too.
THP_TUNABLE = "glibc.malloc.hugetlb=1"
# What this process's glibc read at start (the benchmark sets GLIBC_TUNABLES for its children).
_STARTED_WITH_TUNABLES = os.environ.get("GLIBC_TUNABLES", "")


def thp_available() -> bool:
  """Whether the kernel offers transparent huge pages to processes that ask (Linux)."""
  mode = _read_text("/sys/kernel/mm/transparent_hugepage/enabled")
  return "[always]" in mode or "[madvise]" in mode


def with_thp_malloc(env: dict[str, str]) -> dict[str, str]:
  """`env` with THP_TUNABLE added to GLIBC_TUNABLES (read by glibc >= 2.35 at process start;
  ignored elsewhere), unless the kernel has no THP or the caller already set hugetlb."""
  tunables = env.get("GLIBC_TUNABLES", "")
  if not thp_available() or "glibc.malloc.hugetlb" in tunables:
    return env
  return {**env, "GLIBC_TUNABLES": f"{tunables}:{THP_TUNABLE}" if tunables else THP_TUNABLE}


def minor_faults() -> int:
  """Minor page faults of this process so far."""
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_rss_gb() -> float:
  """This process's peak resident set (VmHWM), in GB."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024 / 1e9
  return float("nan")


def load_average() -> float:
  return os.getloadavg()[0]


def max_predictions(seq: int) -> int:
  return MAX_PREDICTIONS.get(seq, max(1, round(0.15 * seq)))


def matmul_peak_gflops(dtype: str, n: int = 2048, reps: int = 7) -> float:
  """Best GFLOP/s over `reps` n x n x n matmuls in `dtype` (bf16 operands accumulate in f32,
  the way model.matmul computes), measured in this process. The best, not the median: a peak
  is what the machine can do, and on a shared host a median dips with the neighbours' load."""
  import jax
  import jax.numpy as jnp

  x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
  jax.block_until_ready(f(x))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    times.append(time.perf_counter() - t0)
  return 2 * n**3 / min(times) / 1e9


def synthetic_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A full-length NSP-style host batch ([CLS] A [SEP] B [SEP], no padding), as the input
  pipeline yields it (masking happens on device, inside the step)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1000, vocab, (batch, seq)).astype(np.int32)
  half = seq // 2
  ids[:, 0], ids[:, half - 1], ids[:, -1] = 101, 102, 102
  seg = np.zeros((batch, seq), np.int32)
  seg[:, half:] = 1
  return {
    "input_ids": ids,
    "segment_ids": seg,
    "input_mask": np.ones((batch, seq), np.int32),
    "next_sentence_label": rng.integers(0, 2, batch).astype(np.int32),
    "example_id": np.arange(batch, dtype=np.int32),
    "epoch": np.zeros(batch, np.int32),
  }


def bench_config(size: str, seq: int, batch: int, dtype: str, overrides: dict[str, Any]):
  """The trainer's config for a named size, with model-field overrides."""
  from bert_jax import config_lib

  c = config_lib.base_config(size)
  c.data.batch_size = batch
  c.data.max_seq_length = seq
  c.masking.max_predictions = max_predictions(seq)
  c.model.dtype = dtype
  c.opt.total_steps = 1_000_000
  c.mesh.shape = (1, 1, 1)
  for k, v in overrides.items():
    if k not in c.model:
      raise ValueError(f"--variant key {k!r} is not a BertConfig field")
    c.model[k] = type(c.model[k])(v) if c.model[k] is not None else v
  return c


@functools.cache
def _default_tables():
  from bert_jax import masking
  from bert_jax import tokenizer as tokenizer_lib

  return masking.tables_from_tokenizer(
    tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())
  )


@dataclasses.dataclass
class Step:
  """A compiled train step with its state, ready to be called."""

  fn: Any
  state: Any
  batch: Any
  rng: Any
  cfg: Any
  lower_s: float
  compile_s: float
  compiled: Any


def build_step(config, tables=None) -> Step:
  """Jits `train.make_train_step` as `train.train_and_evaluate` does, on one device."""
  import jax

  from bert_jax import input_pipeline, objectives, optim, train
  from bert_jax import model as model_lib
  from bert_jax import sharding as sh

  if tables is None:
    tables = _default_tables()
  mesh = sh.make_mesh(tuple(config.mesh.shape), devices=jax.devices()[:1])
  rules = sh.rules_from_config(config.mesh.rules)
  cfg = train.bert_config(config)
  model = model_lib.BertForPreTraining(cfg)
  tx = optim.make_optimizer(config.opt)
  obj = objectives.Objective.from_config(config)
  rng = jax.random.key(config.seed)
  init_rng, step_rng = jax.random.split(rng)
  state, state_sh, _ = train.create_state(config, model, tx, mesh, rules, init_rng)
  host = synthetic_batch(config.data.batch_size, config.data.max_seq_length, cfg.vocab_size)
  batch = input_pipeline.to_global(host, mesh)
  with sh.mesh_context(mesh, rules):
    fn = jax.jit(
      train.make_train_step(model, tx, obj, tables, config.opt.grad_accum_steps),
      in_shardings=(state_sh, sh.batch_sharding(mesh), sh.replicated(mesh)),
      out_shardings=(state_sh, sh.replicated(mesh)),
      donate_argnums=0,
    )
    t0 = time.perf_counter()
    lowered = fn.lower(state, batch, step_rng)
    lower_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  return Step(compiled, state, batch, step_rng, cfg, lower_s, compile_s, compiled)


def run_steps(step: Step, n: int, timed: bool = True) -> tuple[list[float], list[float]]:
  """n steps; returns (per-step seconds, losses). Syncs on each step only to time it."""
  import jax

  times, losses = [], []
  for _ in range(n):
    t0 = time.perf_counter()
    step.state, metrics = step.fn(step.state, step.batch, step.rng)
    if timed:
      jax.block_until_ready((step.state, metrics))
      times.append(time.perf_counter() - t0)
    losses.append(metrics["loss"])
  return times, [float(x) for x in jax.device_get(losses)]


def summarize_times(times: Sequence[float]) -> dict[str, float]:
  return {
    "step_ms_median": 1e3 * statistics.median(times),
    "step_ms_min": 1e3 * min(times),
    "step_ms_max": 1e3 * max(times),
  }


def measure_ours(
  size: str,
  seq: int,
  batch: int,
  dtype: str,
  steps: int,
  warmup: int,
  variant: dict[str, Any] | None = None,
  peak: bool = True,
  memory: bool = False,
  serve: bool = False,
) -> dict[str, Any]:
  """One measurement of our train step (in this process). With `serve`, the timed steps are
  the ones the lockstep parent asks for on stdin (`_lockstep_serve`), not `steps`."""
  import jax

  from bert_jax import model as model_lib

  variant = dict(variant or {})
  config = bench_config(size, seq, batch, dtype, variant)
  step = build_step(config)
  t0 = time.perf_counter()
  _, warm_losses = run_steps(step, max(1, warmup))
  first_s = time.perf_counter() - t0
  # The peak is measured before and after the timed steps and the higher one kept, so a
  # transient slowdown of the host cannot lower the MFU denominator.
  peak_dtypes = (["float32"] + ([dtype] if dtype != "float32" else [])) if peak else []
  peaks = {d: matmul_peak_gflops(d) for d in peak_dtypes}
  load = load_average()
  faults = minor_faults()
  if serve:
    losses: list[float] = []

    def one() -> float:
      t, loss = run_steps(step, 1)
      losses.extend(loss)
      return t[0]

    times = _lockstep_serve(one)
    n_run = len(losses)  # the settle steps fault too
  else:
    times, losses = run_steps(step, steps)
    n_run = steps
  faults = (minor_faults() - faults) / max(1, n_run)
  peaks = {d: max(g, matmul_peak_gflops(d)) for d, g in peaks.items()}
  flops = model_lib.train_flops_per_token(step.cfg, seq, max_predictions(seq))
  med = statistics.median(times)
  rec = {
    "kind": "train_step",
    "impl": "bert_jax",
    "size": size,
    "seq": seq,
    "batch": batch,
    "dtype": dtype,
    "variant": variant,
    **summarize_times(times),
    "step_s": times,
    "tokens_per_s": batch * seq / med,
    "flops_per_token": flops,
    "gflops": flops * batch * seq / med / 1e9,
    "compile_s": step.lower_s + step.compile_s,
    "lower_s": step.lower_s,
    "warmup_s": first_s,
    "peak_rss_gb": peak_rss_gb(),
    "page_faults_per_step": faults,
    "glibc_tunables": _STARTED_WITH_TUNABLES,
    "losses": warm_losses + losses,
    "load_avg": load,
    "jax": jax.__version__,
  }
  if memory:
    rec.update(memory_record(step))
    rec["peak_rss_ratio"] = rec["peak_rss_gb"] / rec["params_grads_adam_gb"]
  if peaks:
    rec["peak_gflops"] = peaks
    rec["mfu_fp32_peak"] = rec["gflops"] / peaks["float32"]
    rec["mfu"] = rec["gflops"] / peaks[dtype]
  return rec


# ----------------------------------------------------------------------------- peers


def _peer_worker(spec: dict) -> dict:
  """Times one HuggingFace BertForPreTraining train step (Flax or PyTorch).

  Runs in the peer interpreter from its source text, so it imports nothing of bert_jax.
  Step: forward (MLM logits at every position, as HF does), MLM loss on 15% of the positions
  + NSP loss, backward, AdamW (decay off for biases/LayerNorm), dropout `spec['dropout']`.
  """
  import os
  import time

  import numpy as np

  def peak_rss_gb():
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024 / 1e9
    return float("nan")

  import transformers

  fw, b, s, v = spec["framework"], spec["batch"], spec["seq"], spec["vocab"]
  hf_cfg = transformers.BertConfig(
    vocab_size=v,
    hidden_size=spec["hidden"],
    num_hidden_layers=spec["layers"],
    num_attention_heads=spec["heads"],
    intermediate_size=spec["intermediate"],
    max_position_embeddings=spec["max_pos"],
    type_vocab_size=2,
    hidden_dropout_prob=spec["dropout"],
    attention_probs_dropout_prob=spec["dropout"],
  )
  rs = np.random.RandomState(0)
  ids = rs.randint(1000, v, (b, s)).astype(np.int32)
  seg = np.zeros((b, s), np.int32)
  seg[:, s // 2 :] = 1
  labels = rs.randint(1000, v, (b, s)).astype(np.int32)
  weights = (rs.rand(b, s) < 0.15).astype(np.float32)
  nsp = rs.randint(0, 2, b).astype(np.int32)
  info = {"transformers": transformers.__version__}
  compile_s = 0.0

  if fw == "hf_flax":
    import jax
    import jax.numpy as jnp
    import optax

    info["jax"] = jax.__version__
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[spec["dtype"]]
    model = transformers.FlaxBertForPreTraining(hf_cfg, input_shape=(1, s), seed=0, dtype=dtype)
    params = model.params

    def mask_fn(tree):
      return jax.tree_util.tree_map_with_path(
        lambda p, _: str(getattr(p[-1], "key", p[-1])) not in ("bias", "scale"), tree
      )

    tx = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=mask_fn)
    opt_state = tx.init(params)
    batch = jax.device_put(
      {
        "ids": ids,
        "seg": seg,
        "mask": np.ones_like(ids),
        "labels": labels,
        "w": weights,
        "nsp": nsp,
      }
    )

    def step(params, opt_state, batch, rng):
      rng, drng = jax.random.split(rng)

      def loss_fn(p):
        out = model(
          batch["ids"],
          attention_mask=batch["mask"],
          token_type_ids=batch["seg"],
          params=p,
          dropout_rng=drng,
          train=True,
        )
        ce = optax.softmax_cross_entropy_with_integer_labels(
          out.prediction_logits.astype(jnp.float32), batch["labels"]
        )
        mlm = jnp.sum(ce * batch["w"]) / jnp.maximum(jnp.sum(batch["w"]), 1.0)
        nsp_ce = optax.softmax_cross_entropy_with_integer_labels(
          out.seq_relationship_logits.astype(jnp.float32), batch["nsp"]
        )
        return mlm + jnp.mean(nsp_ce)

      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss, rng

    t0 = time.perf_counter()
    compiled = (
      jax.jit(step, donate_argnums=(0, 1))
      .lower(params, opt_state, batch, jax.random.PRNGKey(1))
      .compile()
    )
    compile_s = time.perf_counter() - t0
    carry = [params, opt_state, jax.random.PRNGKey(1)]

    def run():
      carry[0], carry[1], loss, carry[2] = compiled(carry[0], carry[1], batch, carry[2])
      jax.block_until_ready((carry[0], loss))
      return float(loss)
  else:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    info["torch"] = torch.__version__
    model = transformers.BertForPreTraining(hf_cfg).float().train()
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    opt = torch.optim.AdamW(
      [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
      lr=1e-4,
      eps=1e-6,
    )
    t_ids, t_seg = torch.from_numpy(ids).long(), torch.from_numpy(seg).long()
    t_labels = torch.from_numpy(np.where(weights > 0, labels, -100)).long()
    t_nsp, t_mask = torch.from_numpy(nsp).long(), torch.ones(b, s, dtype=torch.long)
    fwd = torch.compile(model) if fw == "torch_compile" else model
    amp = spec["dtype"] == "bfloat16"

    def run():
      opt.zero_grad(set_to_none=True)
      with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=amp):
        out = fwd(
          input_ids=t_ids,
          attention_mask=t_mask,
          token_type_ids=t_seg,
          labels=t_labels,
          next_sentence_label=t_nsp,
        )
      out.loss.backward()
      opt.step()
      return float(out.loss.detach())

  losses, warm = [], []
  for _ in range(max(1, spec["warmup"])):
    t0 = time.perf_counter()
    losses.append(run())
    warm.append(time.perf_counter() - t0)
  load = os.getloadavg()[0]

  def timed() -> float:
    t0 = time.perf_counter()
    losses.append(run())
    return time.perf_counter() - t0

  if spec.get("serve"):
    times = _lockstep_serve(timed)  # noqa: F821 (its source is sent along with this one's)
  else:
    times = [timed() for _ in range(spec["steps"])]
  if fw == "torch_compile" and times:  # its compile happens inside the first call
    compile_s = max(0.0, warm[0] - sorted(times)[len(times) // 2])
  return {
    "step_s": times,
    "warmup_s": sum(warm),
    "compile_s": compile_s,
    "losses": losses,
    "peak_rss_gb": peak_rss_gb(),
    "load_avg": load,
    "versions": info,
  }


# Captured at import: inspect reads the file again, which may have changed since.
_PEER_SRC = inspect.getsource(_lockstep_serve) + "\n\n" + inspect.getsource(_peer_worker)


def peer_available(python: str) -> dict[str, bool]:
  """Which peer frameworks `python` can import."""
  code = (
    "import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None "
    "for m in ('torch', 'transformers', 'jax', 'optax', 'flax')}))"
  )
  try:
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    mods = json.loads(out.stdout.strip().splitlines()[-1])
  except (OSError, subprocess.SubprocessError, ValueError, IndexError):
    return {"hf_flax": False, "torch": False, "torch_compile": False}
  if mods["transformers"]:
    import_ok = subprocess.run(
      [python, "-c", "import transformers; assert int(transformers.__version__.split('.')[0]) < 5"],
      capture_output=True,
      timeout=300,
    )
    flax_ok = import_ok.returncode == 0 and mods["jax"] and mods["flax"] and mods["optax"]
  else:
    flax_ok = False
  torch_ok = mods["torch"] and mods["transformers"]
  return {"hf_flax": flax_ok, "torch": torch_ok, "torch_compile": torch_ok}


def _subprocess_env() -> dict[str, str]:
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")  # a libtpu install otherwise logs errors at start
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return env


def _run_subprocess(argv: list[str], timeout: float) -> dict[str, Any]:
  proc = subprocess.run(
    argv, capture_output=True, text=True, timeout=timeout, env=_subprocess_env()
  )
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(_RESULT_MARK):
      return json.loads(line[len(_RESULT_MARK) :])
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
  raise RuntimeError(f"benchmark worker {argv[1:3]} failed (exit {proc.returncode}): {tail}")


def _peer_spec(framework: str, dtype: str, size: str, seq: int, batch: int) -> dict[str, Any]:
  from bert_jax import model as model_lib

  cfg = model_lib.config_for_size(size)
  return {
    "framework": framework,
    "dtype": dtype,
    "size": size,
    "batch": batch,
    "seq": seq,
    "layers": cfg.num_layers,
    "hidden": cfg.hidden_size,
    "heads": cfg.num_heads,
    "intermediate": cfg.intermediate_size,
    "vocab": cfg.vocab_size,
    "max_pos": cfg.max_position_embeddings,
    "dropout": 0.1,
  }


def _peer_argv(python: str, spec: dict[str, Any]) -> list[str]:
  code = (
    f"import json, sys\n{_PEER_SRC}\n"
    f"print({_RESULT_MARK!r} + json.dumps(_peer_worker(json.loads(sys.argv[1]))))\n"
  )
  return [python, "-c", code, json.dumps(spec)]


def _peer_record(spec: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
  from bert_jax import model as model_lib

  times = out["step_s"]
  med = statistics.median(times)
  seq, batch = spec["seq"], spec["batch"]
  # HF computes the MLM head at every position.
  flops = model_lib.train_flops_per_token(model_lib.config_for_size(spec["size"]), seq, seq)
  return {
    "kind": "train_step",
    "impl": spec["framework"],
    "size": spec["size"],
    "seq": seq,
    "batch": batch,
    "dtype": spec["dtype"],
    "variant": {},
    **summarize_times(times),
    "tokens_per_s": batch * seq / med,
    "flops_per_token": flops,
    "gflops": flops * batch * seq / med / 1e9,
    **out,
  }


def measure_peer(
  python: str,
  framework: str,
  dtype: str,
  size: str,
  seq: int,
  batch: int,
  steps: int,
  warmup: int,
  timeout: float = 3600,
) -> dict[str, Any]:
  """One peer measurement in a fresh `python` process."""
  spec = {**_peer_spec(framework, dtype, size, seq, batch), "steps": steps, "warmup": warmup}
  return _peer_record(spec, _run_subprocess(_peer_argv(python, spec), timeout))


def _ours_argv(spec: dict[str, Any]) -> list[str]:
  """A fresh interpreter running measure_ours(**spec) (`--worker`)."""
  return [sys.executable, "-m", "bert_jax.benchmark", "--worker=" + json.dumps(spec)]


def measure_ours_subprocess(spec: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
  """measure_ours in a fresh interpreter (its own compile time, peak RSS, matmul peak)."""
  return _run_subprocess(_ours_argv(spec), timeout)


class _LockstepWorker:
  """A measurement process kept alive between steps: it compiles and warms up, then runs one
  step each time it is asked (`_lockstep_serve`), and reports its record at the end. `env`
  entries override this process's environment for it; a worker silent for `timeout` seconds
  (start-up included) is killed and reported."""

  def __init__(self, name: str, argv: list[str], timeout: float, env: dict | None = None):
    self.name, self.timeout = name, timeout
    self._err = tempfile.TemporaryFile("w+")  # a file, so a chatty stderr cannot block it
    self.proc = subprocess.Popen(
      argv,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self._err,
      text=True,
      env={**_subprocess_env(), **(env or {})},
    )
    self._read_until(_READY_MARK)

  def _read_until(self, mark: str) -> str:
    timed_out = threading.Event()

    def stop() -> None:
      timed_out.set()
      self.proc.kill()  # unblocks the readline below

    watchdog = threading.Timer(self.timeout, stop)
    watchdog.start()
    try:
      while True:
        line = self.proc.stdout.readline()
        if not line:
          break
        if line.startswith(mark):
          return line[len(mark) :]
    finally:
      watchdog.cancel()
    self._err.seek(0)
    tail = self._err.read().strip().splitlines()[-3:]
    code = self.proc.wait()
    why = f"timed out after {self.timeout:g} s" if timed_out.is_set() else f"exited ({code}) early"
    raise RuntimeError(f"lockstep worker {self.name} {why}: {tail}")

  def step(self, settle: bool = False) -> float:
    self.proc.stdin.write("settle\n" if settle else "step\n")
    self.proc.stdin.flush()
    return float(self._read_until(_STEP_MARK))

  def finish(self) -> dict[str, Any]:
    self.proc.stdin.write("end\n")
    self.proc.stdin.flush()
    rec = json.loads(self._read_until(_RESULT_MARK))
    self.proc.wait(timeout=self.timeout)
    return rec

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    self._err.close()


def lockstep_rounds(
  a: _LockstepWorker, b: _LockstepWorker, rounds: int, min_turn_s: float, settle_steps: int
) -> dict[str, list]:
  """`rounds` rounds of one turn each of `a` and `b`, `a` first in even rounds and `b` first in
  odd ones. A turn is `settle_steps` untimed steps, then timed whole steps until `min_turn_s`
  have passed. Returns per worker its turns as (steps, seconds) and its settle steps' seconds."""
  out: dict[str, list] = {"a_turns": [], "b_turns": [], "a_settle_s": [], "b_settle_s": []}
  for r in range(rounds):
    for w, k in ((a, "a"), (b, "b"))[:: 1 if r % 2 == 0 else -1]:
      out[f"{k}_settle_s"] += [w.step(settle=True) for _ in range(settle_steps)]
      n, t = 0, 0.0
      while n == 0 or t < min_turn_s:
        n, t = n + 1, t + w.step()
      out[f"{k}_turns"].append((n, t))
  return out


def measure_lockstep(
  size: str,
  seq: int,
  batch: int,
  dtype: str,
  rounds: int,
  warmup: int,
  peers: Sequence[tuple[str, str]],
  peer_python: str,
  timeout: float = 3600,
  peer_argv=None,
  min_turn_s: float = 3.0,
  settle_steps: int = 1,
) -> list[dict[str, Any]]:
  """Ours against each peer in alternating turns of steps, from processes kept alive throughout.

  Our worker compiles once and stays up; the peers come one at a time beside it (so at most
  two models are resident). For each peer, `rounds` rounds of one turn each (`lockstep_rounds`),
  so a drift of the host's speed within a round falls on both alike; a turn times whole steps
  for `min_turn_s` (one step for base) after `settle_steps` untimed ones. The untimed ones
  matter: on session 7's VM a 4-layer
  base step took ~30% longer right after the other process's step than right after its own
  (fresh memory from the kernel after another process ran, most likely), and a process that
  frees its activations every step (XLA, ours and HF Flax's) pays that more than one that
  keeps them.
  Returns one "lockstep" record per peer (the per-round ratios), the peers' step records, and
  ours (all its timed steps; MFU against its own matmul peak) last.
  `peer_argv(spec) -> argv` replaces the HF/PyTorch worker (tests time ours against ours).
  """
  peer_argv = peer_argv or functools.partial(_peer_argv, peer_python)
  spec = dict(size=size, seq=seq, batch=batch, dtype=dtype, steps=0, warmup=warmup)
  spec.update(variant=dict(FAST), serve=True)
  ours = _LockstepWorker("bert_jax", _ours_argv(spec), timeout)
  out: list[dict[str, Any]] = []
  try:
    for fw, dt in peers:
      pspec = {**_peer_spec(fw, dt, size, seq, batch), "warmup": warmup, "serve": True}
      try:
        peer = _LockstepWorker(f"{fw}:{dt}", peer_argv(pspec), timeout)
      except RuntimeError as e:
        err = {"kind": "error", "impl": fw, "size": size, "seq": seq, "dtype": dt}
        out.append({**err, "error": str(e)[-500:]})
        continue
      try:
        got = lockstep_rounds(ours, peer, rounds, min_turn_s, settle_steps)
        prec = _peer_record(pspec, peer.finish())
      finally:
        peer.close()
      t_ours, t_peer = got["a_turns"], got["b_turns"]
      ours_tps = [n * batch * seq / t for n, t in t_ours]
      peer_tps = [n * batch * seq / t for n, t in t_peer]
      ratios = [a / b for a, b in zip(ours_tps, peer_tps, strict=True)]
      out.append(
        {
          "kind": "lockstep",
          "size": size,
          "seq": seq,
          "batch": batch,
          "dtype": dtype,
          "peer": f"{fw}:{dt}",
          "rounds": rounds,
          "min_turn_s": min_turn_s,
          "settle_steps": settle_steps,
          "ours_turns": t_ours,
          "peer_turns": t_peer,
          "ours_settle_s": got["a_settle_s"],
          "peer_settle_s": got["b_settle_s"],
          "ratio_per_round": ratios,  # ours tokens/s over the peer's, round by round
          "ratio_min": min(ratios),
          "ratio_median": statistics.median(ratios),
          "ratio_max": max(ratios),
          "ours_tokens_per_s": statistics.median(ours_tps),
          "peer_tokens_per_s": statistics.median(peer_tps),
        }
      )
      out.append(prec)
    out.append(ours.finish())
  finally:
    ours.close()
  return out


# ----------------------------------------------------------------------------- other checks


def measure_data(seq: int = 128, batch: int = 32, batches: int = 50) -> dict[str, Any]:
  """create_data on the bundled corpus, then the input pipeline reading it back."""
  from bert_jax import create_data, input_pipeline
  from bert_jax import tokenizer as tokenizer_lib

  corpus = os.path.join(
    os.path.dirname(tokenizer_lib.default_vocab_path()), "sample_public_domain.txt"
  )
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "data")
    t0 = time.perf_counter()
    summary = create_data.build(
      corpus, out, max_seq_length=seq, dupe_factor=1, num_workers=1, progress=False
    )
    build_s = time.perf_counter() - t0
    train = summary["splits"]["train"]
    ds = input_pipeline.make_dataset(
      out, "train", global_batch_size=batch, seed=0, process_index=0, process_count=1
    )
    it = iter(ds)
    first = next(it)
    t0 = time.perf_counter()
    real = 0
    for _ in range(batches):
      b = next(it)
      real += int(b["input_mask"].sum())
    read_s = time.perf_counter() - t0
  del first
  return {
    "kind": "data",
    "seq": seq,
    "corpus_bytes": os.path.getsize(corpus),
    "create_data_s": build_s,
    "create_data_sequences_per_s": train["num_sequences"] / build_s,
    "create_data_tokens_per_s": train["num_tokens"] / build_s,
    "pipeline_batches_per_s": batches / read_s,
    "pipeline_tokens_per_s": batches * batch * seq / read_s,
    "padding_fraction": 1.0 - real / (batches * batch * seq),
  }


def _state_bytes(params) -> int:
  import jax

  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


def memory_record(step: Step) -> dict[str, float]:
  """XLA's buffer accounting for the compiled step, against params + grads + Adam moments."""
  m = step.compiled.memory_analysis()
  param_b = _state_bytes(step.state["params"])
  rec = {"param_gb": param_b / 1e9, "params_grads_adam_gb": 4 * param_b / 1e9}
  if m is not None:
    peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    peak += m.temp_size_in_bytes
    rec.update(
      xla_argument_gb=m.argument_size_in_bytes / 1e9,
      xla_temp_gb=m.temp_size_in_bytes / 1e9,
      xla_output_gb=m.output_size_in_bytes / 1e9,
      xla_alias_gb=m.alias_size_in_bytes / 1e9,
      xla_peak_gb=peak / 1e9,
      xla_peak_ratio=peak / (4 * param_b),
    )
  return rec


def loss_check(
  size: str = "tiny",
  steps: int = 20,
  batch: int = 8,
  seq: int = 64,
  checks: dict[str, dict[str, Any]] | None = None,
  plain: dict[str, Any] | None = None,
  dtypes: Sequence[str] = ("float32", "bfloat16"),
) -> list[dict[str, Any]]:
  """Losses of `steps` train steps of the plain configuration (fp32) and of each fast one in
  `checks` (default `LOSS_CHECKS`; in each of `dtypes`) from the same initial weights and
  batches; one record per (check, dtype).

  Dropout is off in all (the layouts draw dropout masks differently, e.g. scan splits the
  key per layer), so any difference is arithmetic."""
  import jax

  from bert_jax import input_pipeline, interop, optim

  checks = {k: {**FAST, **v} for k, v in (checks or LOSS_CHECKS).items()}
  plain = {**PLAIN, **(plain or {})}
  no_dropout = {"hidden_dropout_prob": 0.0, "attention_dropout_prob": 0.0}
  losses: dict[str, list[float]] = {}
  init = None
  runs = [("plain", plain, "float32")]
  runs += [(name, variant, d) for name, variant in checks.items() for d in dtypes]
  for name, variant, dt in runs:
    config = bench_config(size, seq, batch, dt, {**variant, **no_dropout})
    config.opt.warmup_steps = 2
    config.opt.total_steps = steps + 1
    config.opt.lr = 1e-3  # large enough that 20 steps move the loss visibly
    step = build_step(config)
    params = jax.device_get(step.state["params"])
    if init is None:
      init = params
    else:
      params = interop.to_layout(interop.unstack_layers(init), step.cfg.scan_layers)
    tx = optim.make_optimizer(config.opt)
    sharding = jax.tree.map(lambda x: x.sharding, step.state)
    state = {"step": step.state["step"], "params": params, "opt_state": tx.init(params)}
    step.state = jax.device_put(state, sharding)
    mesh = jax.tree.leaves(step.batch)[0].sharding.mesh
    curve = []
    for i in range(steps):
      host = synthetic_batch(batch, seq, step.cfg.vocab_size, seed=i % 4)
      step.batch = input_pipeline.to_global(host, mesh)
      curve += run_steps(step, 1, timed=False)[1]
    losses[f"{name}:{dt}"] = curve
  a = np.array(losses["plain:float32"])
  out = []
  for (name, variant), dt in itertools.product(checks.items(), dtypes):
    b = np.array(losses[f"{name}:{dt}"])
    out.append(
      {
        "kind": "loss_check",
        "check": name,
        "size": size,
        "dtype": dt,
        "fast": variant,
        "plain": plain,
        "plain_losses": a.tolist(),
        "fast_losses": b.tolist(),
        "max_abs_diff": float(np.max(np.abs(a - b))),
        "max_rel_diff": float(np.max(np.abs(a - b) / np.abs(a))),
      }
    )
  return out


# ----------------------------------------------------------------------------- suite


def _emit(rec: dict[str, Any], json_out: str | None) -> None:
  line = json.dumps(rec, sort_keys=True)
  print(line, flush=True)
  if json_out:
    with open(json_out, "a") as f:
      f.write(line + "\n")


def _parse_value(text: str) -> Any:
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
  """'scan_layers=True,remat_policy=full;attention_impl=explicit' -> list of dicts."""
  out = []
  for part in text.split(";"):
    v: dict[str, Any] = {}
    for item in filter(None, part.split(",")):
      if "=" not in item:
        raise ValueError(f"--variants item {item!r} is not key=value")
      k, val = item.split("=", 1)
      v[k] = _parse_value(val)
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
  peers: Sequence[tuple[str, str]] = (),
  peer_python: str | None = None,
  variants: Sequence[dict[str, Any]] = ({},),
  json_out: str | None = None,
  isolate: bool = True,
) -> list[dict[str, Any]]:
  """All measurements, interleaved: pass -> seq -> size -> (ours..., peers...)."""
  records = []
  for p in range(passes):
    for seq in seqs:
      for size in sizes:
        jobs = [("ours", dt, v) for v in variants for dt in dtypes]
        jobs += [(fw, dt, {}) for fw, dt in peers]
        for impl, dtype, variant in jobs:
          t0 = time.perf_counter()
          try:
            if impl == "ours":
              spec = dict(
                size=size,
                seq=seq,
                batch=batch,
                dtype=dtype,
                steps=steps,
                warmup=warmup,
                variant={**FAST, **variant},
              )
              rec = measure_ours_subprocess(spec) if isolate else measure_ours(**spec)
            else:
              rec = measure_peer(peer_python, impl, dtype, size, seq, batch, steps, warmup)
          except (RuntimeError, subprocess.TimeoutExpired) as e:
            rec = {
              "kind": "error",
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
          _emit(rec, json_out)
  return records


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per (size, seq): best of our modes vs the fastest peer, per pass and overall."""
  steps = [r for r in records if r.get("kind") == "train_step"]
  out = []
  for size, seq in sorted(
    {(r["size"], r["seq"]) for r in steps}, key=lambda k: (k[1], SIZES_ORDER.get(k[0], 99))
  ):
    rows = [r for r in steps if r["size"] == size and r["seq"] == seq]
    passes = sorted({r["pass"] for r in rows})
    per_pass = []
    for p in passes:
      ours = [
        r
        for r in rows
        if r["pass"] == p and r["impl"] == "bert_jax" and r["variant"] == rows_default_variant(rows)
      ]
      peer = [r for r in rows if r["pass"] == p and r["impl"] != "bert_jax"]
      if not ours:
        continue
      best = max(ours, key=lambda r: r["tokens_per_s"])
      entry = {"pass": p, "ours_best": best["tokens_per_s"], "ours_best_dtype": best["dtype"]}
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
      per_pass.append(entry)
    if not per_pass:
      continue
    summary = {"kind": "summary", "size": size, "seq": seq, "passes": per_pass}
    for key in (
      "ratio_vs_fastest_peer",
      "ratio_vs_hf_flax_fp32",
      "ours_best",
      "mfu_float32_vs_fp32_peak",
    ):
      vals = [e[key] for e in per_pass if key in e]
      if vals:
        summary[f"{key}_min"] = min(vals)
        summary[f"{key}_median"] = statistics.median(vals)
    out.append(summary)
  return out


SIZES_ORDER = {s: i for i, s in enumerate(("tiny", "mini", "small", "medium", "base", "large"))}


def rows_default_variant(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The variant our main measurements used (the first one run)."""
  ours = [r for r in rows if r["impl"] == "bert_jax"]
  return ours[0]["variant"] if ours else {}


def format_table(records: Sequence[dict[str, Any]], summaries: Sequence[dict[str, Any]]) -> str:
  lines = [
    "| size | seq | impl | dtype | variant | pass | tokens/s | step ms (min/med/max) | "
    "compile s | peak RSS GB | GFLOP/s | MFU vs fp32 peak | load |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in records:
    if r.get("kind") != "train_step":
      continue
    var = ",".join(f"{k}={v}" for k, v in r["variant"].items() if FAST.get(k) != v) or "-"
    mfu = f"{r['mfu_fp32_peak']:.2f}" if "mfu_fp32_peak" in r else ""
    lines.append(
      f"| {r['size']} | {r['seq']} | {r['impl']} | {r['dtype']} | {var} | {r['pass']} | "
      f"{r['tokens_per_s']:.0f} | {r['step_ms_min']:.0f} / {r['step_ms_median']:.0f} / "
      f"{r['step_ms_max']:.0f} | {r['compile_s']:.1f} | {r['peak_rss_gb']:.2f} | "
      f"{r['gflops']:.0f} | {mfu} | {r['load_avg']:.1f} |"
    )
  if summaries:
    lines += [
      "",
      "| size | seq | ours best tok/s (med) | vs fastest peer (min / med) | "
      "vs HF Flax fp32 (min / med) | MFU fp32 (med) |",
      "|---|---|---|---|---|---|",
    ]
    for s in summaries:

      def pair(k, s=s):
        return f"{s[k + '_min']:.2f} / {s[k + '_median']:.2f}" if k + "_min" in s else "-"

      mfu = s.get("mfu_float32_vs_fp32_peak_median")
      lines.append(
        f"| {s['size']} | {s['seq']} | {s['ours_best_median']:.0f} | "
        f"{pair('ratio_vs_fastest_peer')} | {pair('ratio_vs_hf_flax_fp32')} | "
        f"{'' if mfu is None else f'{mfu:.2f}'} |"
      )
  return "\n".join(lines)


def format_lockstep(records: Sequence[dict[str, Any]]) -> str:
  """The --lockstep ratios: ours tokens/s over the peer's, per round."""
  lines = [
    "| size | seq | pass | peer | rounds | ours tok/s (med) | peer tok/s (med) | "
    "ours / peer per round (min / med / max) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in records:
    if r.get("kind") == "lockstep":
      lines.append(
        f"| {r['size']} | {r['seq']} | {r['pass']} | {r['peer']} | {r['rounds']} | "
        f"{r['ours_tokens_per_s']:.0f} | {r['peer_tokens_per_s']:.0f} | "
        f"{r['ratio_min']:.2f} / {r['ratio_median']:.2f} / {r['ratio_max']:.2f} |"
      )
  return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def _define_flags():
  from absl import flags

  f = flags
  f.DEFINE_list("sizes", list(SIZES_DEFAULT), "Model sizes (bert_jax.model.SIZES).")
  f.DEFINE_list("seqs", ["128"], "Sequence lengths.")
  f.DEFINE_integer("batch", 32, "Global batch (sequences).")
  f.DEFINE_list(
    "dtypes",
    None,
    "Our compute dtypes; params stay fp32 (default: float32, and bfloat16 when the CPU has "
    "AVX512-BF16 or AMX; --loss_check: both).",
  )
  f.DEFINE_integer("steps", 5, "Timed steps per measurement (the median is reported).")
  f.DEFINE_integer("warmup", 2, "Untimed steps first (the first compiles).")
  f.DEFINE_integer("passes", 2, "Interleaved passes over everything.")
  f.DEFINE_string("variants", "", "Extra model-field variants, ';'-separated k=v,k=v lists.")
  f.DEFINE_bool("peers", False, "Also time HF Flax / PyTorch BertForPreTraining steps.")
  f.DEFINE_string("peer_python", None, "Interpreter with torch/transformers (default: this one).")
  f.DEFINE_list(
    "peer_list",
    None,
    "framework:dtype peers to time (default: each peer in fp32, and in bf16 when the CPU has "
    "AVX512-BF16 or AMX).",
  )
  f.DEFINE_bool("isolate", True, "Each of our measurements in a fresh process.")
  f.DEFINE_bool(
    "lockstep",
    False,
    "With --peers: keep our step and each peer's (one peer at a time) in live processes and "
    "alternate turns of whole steps, --steps rounds per peer; reports the ratio round by round, "
    "so a host whose speed drifts over minutes still gives side-by-side ratios. Our first "
    "--dtypes only (default: bfloat16 on a CPU with bf16 instructions, else float32), default "
    "variant.",
  )
  f.DEFINE_float("lockstep_turn_s", 3.0, "--lockstep: a turn times whole steps this long.")
  f.DEFINE_integer(
    "lockstep_settle", 1, "--lockstep: untimed steps that open each turn (after a switch)."
  )
  f.DEFINE_bool(
    "thp_malloc",
    True,
    "Run every measured process (ours and the peers alike) with glibc's malloc on transparent "
    f"huge pages ({THP_TUNABLE} in GLIBC_TUNABLES) when the kernel offers them; needs "
    "--isolate (in-process measurements keep the malloc this process started with).",
  )
  f.DEFINE_bool("large", False, "BERT-Large (scan): compile time and step memory.")
  f.DEFINE_integer("large_batch", 8, "Batch of the --large step.")
  f.DEFINE_bool("data", False, "Time create_data and the input pipeline.")
  f.DEFINE_bool("loss_check", False, "Fast vs plain configuration: losses over 20 steps.")
  f.DEFINE_bool("train_steps", True, "Run the train-step suite.")
  f.DEFINE_string("json_out", None, "Also append the JSON lines to this file.")
  f.DEFINE_string("worker", None, "Internal: run one measurement (JSON spec) and exit.")


LARGE_VARIANT = {"scan_layers": True, "remat_policy": "full"}


def main(argv) -> None:
  from absl import flags

  if len(argv) > 1:
    print(f"benchmark: error: unexpected arguments {argv[1:]}", file=sys.stderr)
    sys.exit(2)
  FLAGS = flags.FLAGS  # noqa: N806
  if FLAGS.worker:
    rec = measure_ours(**json.loads(FLAGS.worker))
    print(_RESULT_MARK + json.dumps(rec), flush=True)
    return
  try:
    _main(FLAGS)
  except (ValueError, FileNotFoundError) as e:
    print(f"benchmark: error: {e}", file=sys.stderr)
    sys.exit(1)


def _main(FLAGS) -> None:  # noqa: N803
  from bert_jax import model as model_lib

  for s in FLAGS.sizes:
    if s not in model_lib.SIZES:
      raise ValueError(f"--sizes: unknown size {s!r}; choose from {', '.join(model_lib.SIZES)}")
  seqs = [int(s) for s in FLAGS.seqs]
  variants = [{}] + (parse_variants(FLAGS.variants) if FLAGS.variants else [])
  peers: list[tuple[str, str]] = []
  peer_python = FLAGS.peer_python or sys.executable
  if FLAGS.peers:
    if FLAGS.peer_python and not os.path.exists(FLAGS.peer_python):
      raise FileNotFoundError(f"--peer_python: {FLAGS.peer_python} does not exist")
    ok = peer_available(peer_python)
    for item in FLAGS.peer_list or default_peers():
      fw, _, dt = item.partition(":")
      if fw not in ok:
        raise ValueError(f"--peer_list: unknown peer {fw!r}; use hf_flax, torch, torch_compile")
      if ok[fw]:
        peers.append((fw, dt or "float32"))
      else:
        print(f"benchmark: peer {fw} is not importable in {peer_python}; skipped", file=sys.stderr)
  # Children inherit it: the peers, and ours only when isolated, so only then (both alike).
  if FLAGS.thp_malloc and FLAGS.isolate:
    os.environ.update(with_thp_malloc(dict(os.environ)))
  host = {
    "child_glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    "machine": os.uname().machine,
    "cpus": os.cpu_count(),
    "cpu_bf16": cpu_has_bf16(),
    "load_avg": load_average(),
  }
  _emit({"kind": "host", **host, "python": sys.version.split()[0]}, FLAGS.json_out)
  records: list[dict[str, Any]] = []
  if FLAGS.lockstep and not (peers and FLAGS.isolate):
    raise ValueError("--lockstep needs --peers (with an importable peer) and --isolate")
  if FLAGS.train_steps and FLAGS.sizes and FLAGS.lockstep:
    dtype = lockstep_dtype(FLAGS.dtypes)
    for p, seq, size in itertools.product(range(FLAGS.passes), seqs, FLAGS.sizes):
      t0 = time.perf_counter()
      try:
        recs = measure_lockstep(
          size, seq, FLAGS.batch, dtype, FLAGS.steps, FLAGS.warmup, peers, peer_python,
          min_turn_s=FLAGS.lockstep_turn_s, settle_steps=FLAGS.lockstep_settle,
        )  # fmt: skip
      except RuntimeError as e:
        recs = [{"kind": "error", "impl": "bert_jax", "size": size, "seq": seq, "error": str(e)}]
      for rec in recs:
        rec.update({"pass": p, "wall_s": time.perf_counter() - t0})
        _emit(rec, FLAGS.json_out)
      records += recs
  elif FLAGS.train_steps and FLAGS.sizes:
    records = run_suite(
      FLAGS.sizes,
      seqs,
      FLAGS.batch,
      FLAGS.dtypes or default_dtypes(),
      FLAGS.passes,
      FLAGS.steps,
      FLAGS.warmup,
      peers,
      peer_python,
      variants,
      FLAGS.json_out,
      FLAGS.isolate,
    )
  if FLAGS.large:
    spec = dict(
      size="large",
      seq=128,
      batch=FLAGS.large_batch,
      dtype="float32",
      steps=2,
      warmup=1,
      variant={**FAST, **LARGE_VARIANT},
      peak=False,
      memory=True,
    )
    rec = measure_ours_subprocess(spec) if FLAGS.isolate else measure_ours(**spec)
    rec["kind"] = "large"
    _emit(rec, FLAGS.json_out)
  if FLAGS.data:
    _emit(measure_data(seqs[0]), FLAGS.json_out)
  if FLAGS.loss_check:
    for rec in loss_check(dtypes=FLAGS.dtypes or ["float32", "bfloat16"]):
      _emit(rec, FLAGS.json_out)
  summaries = summarize(records)
  for s in summaries:
    _emit(s, FLAGS.json_out)
  if records:
    print(format_table(records, summaries))
  if any(r.get("kind") == "lockstep" for r in records):
    print("\n" + format_lockstep(records))


def run() -> None:
  from absl import app

  _define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
