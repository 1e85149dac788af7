"""Times one HuggingFace BertForPreTraining train step (Flax or PyTorch), or with
`spec['task'] == 'finetune'` one PyTorch BertForSequenceClassification step: the benchmark's peer.

  PEER_PYTHON path/to/bert_jax/benchmark/peer_worker.py '<json spec from peers.peer_spec>'

Runs by path in an interpreter that has torch/transformers (and jax/flax/optax for `hf_flax`)
but not necessarily bert_jax: it imports only those, numpy, the standard library and its two
siblings `host.py`, `protocol.py` and `batches.py`. Its pretraining step: forward (MLM logits at
every position, as HF computes them), MLM loss on 15% of the positions + NSP loss, backward,
AdamW (no decay for biases and LayerNorm), dropout `spec['dropout']`. Its fine-tuning step, on
`batches.pair_batch` (the arrays ours times): SDPA attention, cross-entropy over
`spec['num_labels']` classes, backward, global-norm clipping at 1.0, AdamW as above with the
warmup + linear decay schedule stepped, as the fine-tuning recipe runs. Prints its record as
`protocol.RESULT_MARK <json>`; with `spec['serve']` it steps on request first (`protocol.serve`).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

if __package__:
  from bert_jax.benchmark import batches, host, kernel_families, protocol
else:  # run by path: the siblings come from this file's directory, sys.path[0]
  import batches
  import host
  import kernel_families
  import protocol

  del sys.path[0]  # no other file here may shadow a module that torch or jax imports


def _hf_config(spec: dict[str, Any], **extra: Any) -> Any:
  import transformers

  return transformers.BertConfig(
    **extra,
    vocab_size=spec["vocab"],
    hidden_size=spec["hidden"],
    num_hidden_layers=spec["layers"],
    num_attention_heads=spec["heads"],
    intermediate_size=spec["intermediate"],
    max_position_embeddings=spec["max_pos"],
    type_vocab_size=2,
    hidden_dropout_prob=spec["dropout"],
    attention_probs_dropout_prob=spec.get("attention_dropout", spec["dropout"]),
  )


def _batch(spec: dict[str, Any]) -> dict[str, np.ndarray]:
  b, s, v = spec["batch"], spec["seq"], spec["vocab"]
  rs = np.random.RandomState(0)
  seg = np.zeros((b, s), np.int32)
  seg[:, s // 2 :] = 1
  return {
    "ids": rs.randint(1000, v, (b, s)).astype(np.int32),
    "seg": seg,
    "mask": np.ones((b, s), np.int32),
    "labels": rs.randint(1000, v, (b, s)).astype(np.int32),
    "w": (rs.rand(b, s) < 0.15).astype(np.float32),
    "nsp": rs.randint(0, 2, b).astype(np.int32),
  }


def flax_step(spec: dict[str, Any], info: dict[str, str]) -> tuple[Callable[[], float], float]:
  """HF's FlaxBertForPreTraining, jitted with params and optimizer state donated; returns
  (one step -> loss, compile seconds)."""
  import jax
  import jax.numpy as jnp
  import optax
  import transformers

  info["jax"] = jax.__version__
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[spec["dtype"]]
  model = transformers.FlaxBertForPreTraining(
    _hf_config(spec), input_shape=(1, spec["seq"]), seed=0, dtype=dtype
  )

  def decays(tree):
    return jax.tree_util.tree_map_with_path(
      lambda p, _: str(getattr(p[-1], "key", p[-1])) not in ("bias", "scale"), tree
    )

  tx = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=decays)
  batch = jax.device_put(_batch(spec))

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

  carry = [model.params, tx.init(model.params), jax.random.PRNGKey(1)]
  t0 = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(*carry[:2], batch, carry[2]).compile()
  compile_s = time.perf_counter() - t0

  def run() -> float:
    carry[0], carry[1], loss, carry[2] = compiled(carry[0], carry[1], batch, carry[2])
    jax.block_until_ready((carry[0], loss))
    return float(loss)

  return run, compile_s


def _instantiate(cls: Any, config: Any, spec: dict[str, Any]) -> Any:
  """`cls(config)`, or with `spec['attn']` (the GPU comparison) that attention implementation
  asked of `_from_config` (transformers 4.x and 5.x alike)."""
  if not spec.get("attn"):
    return cls(config)
  try:
    return cls._from_config(config, attn_implementation=spec["attn"])
  except TypeError:
    config._attn_implementation = spec["attn"]
    return cls(config)


def _torch_pretraining(spec: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray]]:
  """BertForPreTraining and its forward's arguments (labels included), as arrays."""
  import transformers

  a = _batch(spec)
  inputs = {
    "input_ids": a["ids"],
    "attention_mask": a["mask"],
    "token_type_ids": a["seg"],
    "labels": np.where(a["w"] > 0, a["labels"], -100),  # HF's "ignore"
    "next_sentence_label": a["nsp"],
  }
  return _instantiate(transformers.BertForPreTraining, _hf_config(spec), spec), inputs


# `batches.pair_batch`'s fields -> BertForSequenceClassification's arguments.
_HF_ARGS = {
  "input_ids": "input_ids",
  "input_mask": "attention_mask",
  "segment_ids": "token_type_ids",
  "label": "labels",
}


def _torch_finetuning(spec: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray]]:
  """BertForSequenceClassification (SDPA attention) and its forward's arguments: the arrays
  ours times."""
  import transformers

  config = _hf_config(spec, num_labels=spec["num_labels"], attn_implementation="sdpa")
  arrays = batches.pair_batch(spec["batch"], spec["seq"], spec["vocab"])
  inputs = {_HF_ARGS[k]: v for k, v in arrays.items()}
  return _instantiate(transformers.BertForSequenceClassification, config, spec), inputs


def torch_parts(spec: dict[str, Any], info: dict[str, str], device: str = "cpu") -> dict[str, Any]:
  """HF's PyTorch BertForPreTraining (or BertForSequenceClassification) on `device`, its
  inputs there, AdamW (fused on CUDA) and the fine-tuning schedule: what a step closure needs."""
  import torch

  if device == "cpu":
    torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  info["torch"] = torch.__version__
  finetune = spec.get("task") == "finetune"
  model, arrays = (_torch_finetuning if finetune else _torch_pretraining)(spec)
  model = model.float().train().to(device)
  inputs = {k: torch.from_numpy(v).long().to(device) for k, v in arrays.items()}
  info["attn_implementation"] = str(model.config._attn_implementation)
  params = list(model.named_parameters())
  no_decay = [p for n, p in params if n.endswith("bias") or "LayerNorm" in n]
  decay = [p for n, p in params if not (n.endswith("bias") or "LayerNorm" in n)]
  opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
    lr=1e-4,
    eps=1e-6,
    **({"fused": True} if device == "cuda" else {}),
  )
  # Fine-tuning's schedule (10% warmup, then linear decay) stepped after each update, as the
  # recipe runs it (the pretraining step keeps a constant lr).
  total, warmup = 1_000_000, 100_000
  sched = finetune and torch.optim.lr_scheduler.LambdaLR(
    opt, lambda k: k / warmup if k < warmup else (total - k) / (total - warmup)
  )
  # Clipping: the fine-tuning recipe's always; the pretraining step's when the spec asks (the
  # GPU comparison, as our trainer clips at 1.0).
  clip = spec.get("clip_norm") or (1.0 if finetune else None)
  return {"model": model, "inputs": inputs, "opt": opt, "sched": sched, "clip": clip}


def torch_run(
  parts: dict[str, Any], compiled: bool, amp: bool, device: str = "cpu", sync: bool = True
) -> Callable[[], Any]:
  """One train step of `torch_parts`' model, eager or torch.compile'd, fp32 or bf16 autocast;
  returns the loss as a float (`sync`) or as the device tensor (no wait for the step)."""
  import torch

  model, inputs, opt, sched, clip = (parts[k] for k in ("model", "inputs", "opt", "sched", "clip"))
  fwd = torch.compile(model) if compiled else model

  def run() -> Any:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
      out = fwd(**inputs)
    out.loss.backward()
    if clip:
      torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    if sched:
      sched.step()
    loss = out.loss.detach()
    return float(loss) if sync else loss

  return run


def torch_step(spec: dict[str, Any], info: dict[str, str]) -> Callable[[], float]:
  """HF's PyTorch BertForPreTraining (or BertForSequenceClassification) on the CPU, eager or
  torch.compile'd, fp32 or bf16 autocast; returns one step -> loss."""
  parts = torch_parts(spec, info)
  return torch_run(parts, spec["framework"] == "torch_compile", spec["dtype"] == "bfloat16")


def measure(spec: dict[str, Any]) -> dict[str, Any]:
  """`spec['warmup']` untimed steps, then `spec['steps']` timed ones (or, with
  `spec['serve']`, the ones the lockstep parent asks for); returns the peer's record body."""
  import transformers

  info = {"transformers": transformers.__version__}
  compile_s = 0.0
  if spec["framework"] == "hf_flax":
    run, compile_s = flax_step(spec, info)
  else:
    run = torch_step(spec, info)
  losses, warm = [], []
  for _ in range(max(1, spec["warmup"])):
    t0 = time.perf_counter()
    losses.append(run())
    warm.append(time.perf_counter() - t0)
  load = host.load_average()

  def timed() -> float:
    t0 = time.perf_counter()
    losses.append(run())
    return time.perf_counter() - t0

  if spec.get("serve"):
    times = protocol.serve(timed)
  else:
    times = [timed() for _ in range(spec["steps"])]
  if spec["framework"] == "torch_compile" and times:  # it compiles inside its first call
    compile_s = max(0.0, warm[0] - sorted(times)[len(times) // 2])
  return {
    "step_s": times,
    "warmup_s": sum(warm),
    "compile_s": compile_s,
    "losses": losses,
    "peak_rss_gb": host.peak_rss_gb(),
    "load_avg": load,
    "versions": info,
  }


def _torch_peaks(torch: Any, device: str, n: int, chain: int) -> dict[str, Any]:
  """This process's bf16 n x n matmul TFLOP/s: one product `a @ a` timed as one call with its
  sync (`tflops`: the fastest of 10), and `chain` products x <- x @ b (b scaled by 1/sqrt(n))
  timed between CUDA events (`tflops_chain`: the median of 5 after one untimed; on a CPU the
  host clock), as ours (`gpu_ours._peaks`) times them."""
  torch.manual_seed(0)
  a = torch.randn(n, n, device=device).to(torch.bfloat16)
  b = (torch.randn(n, n, device=device) / n**0.5).to(torch.bfloat16)
  cuda = device == "cuda"
  sync = torch.cuda.synchronize if cuda else (lambda: None)

  def one() -> None:
    a @ a
    sync()

  def chained() -> Any:
    x = a
    for _ in range(chain):
      x = x @ b
    return x

  call = 2 * n**3 / min(host.time_calls(one, reps=10)) / 1e12
  chained()
  sync()
  times = []
  for _ in range(5):
    if cuda:
      start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      start.record()
      chained()
      end.record()
      end.synchronize()
      times.append(start.elapsed_time(end) / 1e3)
    else:
      t0 = time.perf_counter()
      chained()
      times.append(time.perf_counter() - t0)
  times.sort()
  return {
    "tflops": call,
    "tflops_chain": 2 * n**3 * chain / times[len(times) // 2] / 1e12,
    "chain_products": chain,
    "chain_timer": "cuda events" if cuda else "host clock",
  }


def _torch_profile(
  torch: Any, run: Callable[[], Any], sync: Callable[[], None], trace_out: str | None
) -> dict[str, Any]:
  """One step of `run` under torch.profiler (CPU and, on CUDA, the device's kernels), its
  Chrome trace by kernel family (`kernel_families`, the classifier our trace is read with);
  the trace, gzipped, goes to `trace_out` when given."""
  from torch.profiler import ProfilerActivity, profile

  acts = [ProfilerActivity.CPU]
  if torch.cuda.is_available():
    acts.append(ProfilerActivity.CUDA)
  t0 = time.perf_counter()
  with profile(activities=acts) as prof:
    run()
    sync()
  trace_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "trace.json")
    prof.export_chrome_trace(path)
    summary = kernel_families.trace_summary(path, steps=1)
    if trace_out:
      os.makedirs(os.path.dirname(trace_out) or ".", exist_ok=True)
      with open(path, "rb") as src, gzip.open(trace_out, "wb") as dst:
        shutil.copyfileobj(src, dst)
  return {
    "steps": summary["steps"],
    "kernel_families_ms": summary["families_ms"],
    "kernel_device_ms": summary["device_ms"],
    "kernel_top": summary["top"],
    "span_ms": summary["span_ms"],
    "trace_s": trace_s,
    "parse_s": time.perf_counter() - t0,
    "trace_file": trace_out,
  }


def gpu_session(spec: dict[str, Any]) -> None:
  """The PyTorch side of `benchmark --gpu` (`gpu.py`), on CUDA (or the CPU in a smoke run).

  After its env record, READY; then each command on stdin. `alone`: the plans marked `alone`
  (torch.compile at Large 128 x 256) built with nothing else compiling, READY. `build`: the
  other plans (eager and torch.compile'd steps of one model share it), each `warmup` steps, so
  torch.compile compiles here; a variant whose estimated build no longer fits before
  `build_until` is skipped (a shape always builds); READY. `time`: this process's bf16
  matmuls (`_torch_peaks`) and each built step, model by model (the shapes smallest first,
  then the variants; each model freed after its steps), as `reps` runs of `steps`
  back-to-back steps with one sync at the end of each, each followed by its profile
  (`_torch_profile`) where one is planned; then RESULT.
  """
  import torch
  import transformers

  device = "cuda" if torch.cuda.is_available() else "cpu"
  cuda = device == "cuda"
  sync = torch.cuda.synchronize if cuda else (lambda: None)
  if cuda:
    torch.backends.cuda.matmul.allow_tf32 = True
  info = {"transformers": transformers.__version__}
  protocol.print_record(
    {
      "side": "torch",
      "kind": "env",
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "device_kind": torch.cuda.get_device_name(0) if cuda else "cpu",
    }
  )
  keys = ("id", "side", "impl", "task", "size", "seq", "batch", "variant")
  models: dict[tuple, dict[str, Any]] = {}
  runs: dict[str, Callable[[], Any]] = {}  # plan id -> its step
  built = []

  def build(plan: dict[str, Any]) -> None:
    rec = {k: plan[k] for k in keys}
    # A shape always builds (the plan admitted it); a variant only while it still fits.
    late = time.time() + plan["est_compile_s"] > spec["build_until"]
    if late and plan.get("role", "shape") != "shape":
      protocol.print_record({**rec, "kind": "skipped", "why": "build deadline"})
      return
    model_key = (plan["task"], plan["size"], plan["seq"], plan["batch"], plan["dropout"],
                 plan.get("attention_dropout", plan["dropout"]))  # fmt: skip
    try:
      if model_key not in models:
        models[model_key] = torch_parts(plan, info, device)
        models[model_key]["attn_implementation"] = info.get("attn_implementation")
      run = torch_run(models[model_key], plan["mode"] == "compile", True, device, sync=False)
      t0 = time.perf_counter()
      run()
      sync()
      first = time.perf_counter() - t0
      for _ in range(spec["warmup"] - 1):
        run()
      sync()
      runs[plan["id"]] = run
      built.append((plan, model_key, first))
      alone = {"alone": True} if plan.get("alone") else {}
      protocol.print_record(
        {**rec, "kind": "built", "first_step_s": first, "build_s": time.perf_counter() - t0,
         **alone}
      )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - one plan's failure is a record, the rest go on
      protocol.print_record({**rec, "kind": "error", "error": protocol.error_text(e)})
    if cuda:
      torch.cuda.empty_cache()

  steps_plans = [p for p in spec["plans"] if p.get("role", "shape") != "profile"]
  profiles = {p["of"]: p for p in spec["plans"] if p.get("role") == "profile"}
  print(protocol.READY_MARK, flush=True)
  while cmd := sys.stdin.readline().strip():
    if cmd in ("alone", "build"):
      for plan in steps_plans:
        if bool(plan.get("alone")) == (cmd == "alone"):
          build(plan)
      print(protocol.READY_MARK, flush=True)
      continue
    if cmd == "time":
      _time_session(spec, torch, device, sync, built, models, runs, profiles)
    break
  protocol.print_result({"side": "torch", "built": len(built)})


def _time_session(spec, torch, device, sync, built, models, runs, profiles) -> None:
  """`gpu_session`'s timing phase (its docstring)."""
  cuda = device == "cuda"
  keys = ("id", "side", "impl", "task", "size", "seq", "batch", "variant")
  n = spec["matmul_n"]
  peak = _torch_peaks(torch, device, n, spec.get("chain", 20))
  protocol.print_record(
    {"side": "torch", "kind": "peak", "dtype": "bfloat16", "matmul_n": n, **peak}
  )
  steps, reps = spec["steps"], spec["reps"]
  order = sorted(built, key=lambda b: (b[0].get("role", "shape") != "shape", b[0]["est_mem"]))
  timed = set()
  for i, (plan, model_key, first) in enumerate(order):
    rec = {k: plan[k] for k in keys}
    late = time.time() + plan["est_step_s"] * steps * reps > spec["end_by"]
    if late and plan.get("role", "shape") != "shape":
      protocol.print_record({**rec, "kind": "skipped", "why": "timing deadline"})
    else:
      try:
        parts = models[model_key]
        state_b = sum(p.numel() * p.element_size() * 3 for p in parts["model"].parameters())
        if cuda:
          torch.cuda.reset_peak_memory_stats()
          base = torch.cuda.memory_allocated()
        losses = []

        def run_n(k: int, run=runs[plan["id"]], losses=losses) -> None:
          for _ in range(k):
            loss = run()
          sync()
          losses.append(float(loss))

        per_step = host.per_step_reps(run_n, steps, reps)
        # This model's weights and AdamW moments, + what its step added on top of what was
        # resident before it (the other models' state included there).
        mem = (state_b + torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else None
        protocol.print_record(
          {
            **rec,
            "kind": "step",
            "step_s": min(per_step),
            "step_s_all": per_step,
            "step_s_median": sorted(per_step)[len(per_step) // 2],
            "first_step_s": first,
            "mem_gib": mem,
            "losses": losses,
            "attn_implementation": models[model_key].get("attn_implementation"),
          }
        )
        timed.add(plan["id"])
        prof = profiles.get(plan["id"])
        if prof and time.time() + spec.get("profile_s", 12.0) / 2 <= spec["end_by"]:
          out_dir = spec.get("profile_dir")
          name = f"{'ft_' if plan['task'] == 'finetune' else ''}{plan['size']}{plan['seq']}"
          trace_out = os.path.join(out_dir, f"torch-{name}.trace.json.gz") if out_dir else None
          try:
            got = _torch_profile(torch, runs[plan["id"]], sync, trace_out)
            protocol.print_record(
              {**rec, "id": prof["id"], "of": plan["id"], "kind": "profile", **got}
            )
          except Exception as e:  # noqa: BLE001 - a failed profile is a record
            protocol.print_record(
              {**rec, "id": prof["id"], "kind": "error", "error": protocol.error_text(e)}
            )
        elif prof:
          protocol.print_record({**rec, "id": prof["id"], "kind": "skipped",
                                 "why": "timing deadline"})  # fmt: skip
      except Exception as e:  # noqa: BLE001
        protocol.print_record({**rec, "kind": "error", "error": protocol.error_text(e)})
    if all(b[1] != model_key for b in order[i + 1 :]):
      # Its steps are done: free it for the larger ones.
      models.pop(model_key, None)
      for b in order:
        if b[1] == model_key:
          runs.pop(b[0]["id"], None)
      if cuda:
        torch.cuda.empty_cache()
  for of_id, prof in profiles.items():
    if of_id not in timed:
      rec = {k: prof[k] for k in keys}
      protocol.print_record({**rec, "kind": "skipped", "why": "its step was not timed"})


if __name__ == "__main__":
  spec = json.loads(sys.argv[1])
  if spec.get("session") == "gpu":
    gpu_session(spec)
  else:
    protocol.print_result(measure(spec))
