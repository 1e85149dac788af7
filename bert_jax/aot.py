r"""Ahead-of-time compile of the real train step for a TPU slice, from a CPU host.

  JAX_PLATFORMS=cpu python -m bert_jax.aot --config=bert_large --topology=v5e-16 \
      [--mesh='(1,-1,1)'] [--config.data.batch_size=512 ...]

Builds the train step exactly as training jits it (`train.jit_train_step`: same shardings, state
donated) on an abstract state (`train.abstract_state`, `jax.eval_shape`: no arrays are
allocated) and an abstract batch, and compiles it with libtpu's compile-only devices for a
named topology (`pip install 'bert_jax[tpu]'`; no TPU needed). Prints per-device memory
(arguments, temporaries, outputs) against the chip's HBM, FLOPs and compile time; exits 1 with
a one-line "does not fit" when XLA runs out of HBM. `--topology=cpu` compiles for the local CPU
devices instead (no libtpu; `--num_cpu_devices` fakes more), as a quick check of the same code
path.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from bert_jax import cli, config_schema

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Topology:
  """Arguments of jax.experimental.topologies.get_topology_desc for one slice type."""

  topology_name: str  # e.g. "v5e:4x4"
  chip_config_name: str  # "megacore" (v4, v5p: one device per chip) or "default"
  chips_per_host_bounds: tuple[int, int, int]
  hbm_bytes: int  # per device (= per chip here)
  device_kind: str


# Named slices (Cloud TPU accelerator types). v4/v5p names count TensorCores (2 per chip,
# fused into one megacore device); v5e/v6e names count chips. HBM per chip: v4 32 GiB,
# v5p 95 GiB, v5e 16 GiB, v6e 32 GiB. Arguments as in MaxText's accelerator_to_spec_map.
TOPOLOGIES = {
  "v4-8": Topology("v4:2x2x1", "megacore", (2, 2, 1), 32 * GiB, "TPU v4"),
  "v4-16": Topology("v4:2x2x2", "megacore", (2, 2, 1), 32 * GiB, "TPU v4"),
  "v4-32": Topology("v4:2x2x4", "megacore", (2, 2, 1), 32 * GiB, "TPU v4"),
  "v5p-8": Topology("v5:2x2x1", "megacore", (2, 2, 1), 95 * GiB, "TPU v5"),
  "v5p-16": Topology("v5:2x2x2", "megacore", (2, 2, 1), 95 * GiB, "TPU v5"),
  "v5e-4": Topology("v5e:2x2", "default", (2, 2, 1), 16 * GiB, "TPU v5 lite"),
  "v5e-8": Topology("v5e:2x4", "default", (2, 2, 1), 16 * GiB, "TPU v5 lite"),
  "v5e-16": Topology("v5e:4x4", "default", (2, 2, 1), 16 * GiB, "TPU v5 lite"),
  "v5e-32": Topology("v5e:4x8", "default", (2, 2, 1), 16 * GiB, "TPU v5 lite"),
  "v5e-64": Topology("v5e:8x8", "default", (2, 2, 1), 16 * GiB, "TPU v5 lite"),
  "v5e-256": Topology("v5e:16x16", "default", (2, 2, 1), 16 * GiB, "TPU v5 lite"),
  "v6e-8": Topology("v6e:2x4", "default", (2, 2, 1), 32 * GiB, "TPU v6 lite"),
  "v6e-16": Topology("v6e:4x4", "default", (2, 2, 1), 32 * GiB, "TPU v6 lite"),
  "v6e-256": Topology("v6e:16x16", "default", (2, 2, 1), 32 * GiB, "TPU v6 lite"),
}


def parse_topology(name: str) -> tuple[str, int]:
  """'v5e-16' -> ('v5e-16', 1); '2xv5e-16' (multislice) -> ('v5e-16', 2); 'cpu' passes."""
  m = re.fullmatch(r"(?:(\d+)x)?([a-z0-9-]+)", name)
  slices, base = (int(m.group(1) or 1), m.group(2)) if m else (1, name)
  if base != "cpu" and base not in TOPOLOGIES:
    raise ValueError(
      f"--topology={name}: unknown; use cpu, one of {', '.join(TOPOLOGIES)}, or NxNAME for "
      "N slices (multislice, e.g. 2xv5e-16)"
    )
  if slices < 1 or (base == "cpu" and slices != 1):
    raise ValueError(f"--topology={name}: bad slice count")
  return base, slices


def topology_devices(name: str) -> tuple[list[Any], Topology | None]:
  """Compile-only TPU devices for a named slice (needs libtpu), or the local CPU devices."""
  import jax

  base, slices = parse_topology(name)
  if base == "cpu":
    return list(jax.devices("cpu")), None
  try:
    import libtpu  # noqa: F401  -- only to give a clear error below
  except ImportError:
    raise ImportError(
      f"--topology={name} needs libtpu: pip install 'bert_jax[tpu]' (or use --topology=cpu)"
    ) from None
  from jax.experimental import topologies

  # Compile-only devices never touch a chip, so several aot runs (or a test run next to one)
  # may load libtpu at once; without this the second one fails on /tmp/libtpu_lockfile.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  t = TOPOLOGIES[base]
  desc = topologies.get_topology_desc(
    topology_name=t.topology_name,
    platform="tpu",
    chip_config_name=t.chip_config_name,
    chips_per_host_bounds=t.chips_per_host_bounds,
    num_slices=slices,
  )
  return list(desc.devices), t


def parse_mesh(text: str) -> tuple[int, ...]:
  """'(1,-1,1)' or '1,-1,1' -> (1, -1, 1)."""
  try:
    shape = tuple(int(x) for x in text.strip("()[] ").split(",") if x.strip())
  except ValueError:
    shape = ()
  if len(shape) != 3:
    raise ValueError(f"--mesh={text}: expected three integers like (1,-1,1)")
  return shape


def _masking_tables(config: ml_collections.ConfigDict) -> Any:
  """The tokenizer's masking tables when one of the right size is at hand (data.dir's, or
  data.vocab, or BERT's), else stand-in tables: compilation only needs their shapes."""
  import numpy as np

  from bert_jax import masking
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  candidates = []
  if config.data.dir:
    candidates.append(os.path.join(config.data.dir, "tokenizer"))
  candidates.append(config.data.vocab or tokenizer_lib.default_vocab_path())
  for path in candidates:
    if os.path.exists(path):
      tok = tokenizer_lib.load_tokenizer(path)
      if tok.vocab_size == config.model.vocab_size:
        return masking.tables_from_tokenizer(tok)
  v = config.model.vocab_size
  special = np.zeros(v, bool)
  special[:5] = True
  return masking.MaskingTables(
    special=special,
    word_start=np.ones(v, bool),
    replace_ids=np.arange(5, v, dtype=np.int32),
    pad_id=0,
    cls_id=1,
    sep_id=2,
    mask_id=3,
  )


def compile_train_step(
  config: ml_collections.ConfigDict,
  topology: str = "cpu",
  mesh_shape: tuple[int, ...] | None = None,
) -> dict[str, Any]:
  """Lowers and compiles the train step of `config` for `topology`; returns the numbers.

  Raises ValueError("does not fit ...") when XLA runs out of device memory.
  """
  import jax
  import jax.numpy as jnp

  from bert_jax import model as model_lib
  from bert_jax import sharding as sh
  from bert_jax import train

  devices, topo = topology_devices(topology)
  mesh = sh.make_mesh(mesh_shape or config.mesh.shape, devices)
  rules = sh.rules_from_config(config.mesh.rules)
  seq_len = config.data.max_seq_length
  # The checks training runs on the data's metadata, here against the config itself.
  metadata = {
    "tokenizer": {"kind": "config", "vocab_size": config.model.vocab_size},
    "max_seq_length": seq_len,
    "nsp": bool(config.objective.nsp),
  }
  train.validate(config, mesh, metadata)

  cfg, model, tx, obj = train.model_and_optimizer(config, devices[0].platform)
  tables = _masking_tables(config)

  state_sh, abstract_state = train.abstract_state(
    config, model, tx, mesh, rules, jax.random.key(config.seed)
  )

  b = config.data.batch_size
  batch_sh = sh.batch_sharding(mesh)
  shapes = {
    "input_ids": (b, seq_len),
    "segment_ids": (b, seq_len),
    "input_mask": (b, seq_len),
    "next_sentence_label": (b,),
    "example_id": (b,),
    "epoch": (b,),
  }
  batch = {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=batch_sh) for k, s in shapes.items()}
  key = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sh.replicated(mesh))

  t0 = time.perf_counter()
  with sh.mesh_context(mesh, rules):
    p_train_step = train.jit_train_step(
      model, tx, obj, tables, config.opt.grad_accum_steps, mesh, state_sh
    )
    lowered = p_train_step.lower(abstract_state, batch, rng)
  t1 = time.perf_counter()
  try:
    compiled = lowered.compile()
  except Exception as e:  # XlaRuntimeError/JaxRuntimeError; matched by status text
    if "RESOURCE_EXHAUSTED" in str(e):
      first = next((ln for ln in str(e).splitlines() if "RESOURCE_EXHAUSTED" in ln), str(e))
      raise ValueError(
        f"does not fit: {topology} mesh {dict(mesh.shape)}, batch {b}: {first.strip()}"
      ) from None
    raise
  t2 = time.perf_counter()

  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, list):  # older jax returned one dict per program
    cost = cost[0] if cost else {}
  preds = seq_len if obj.ltr else obj.masking.max_predictions
  model_flops = model_lib.train_flops_per_token(cfg, seq_len, preds) * b * seq_len
  out: dict[str, Any] = {
    "topology": topology,
    "device_kind": topo.device_kind if topo else devices[0].device_kind,
    "num_devices": len(devices),
    "kernels": model.cfg.kernels,
    "mesh": dict(mesh.shape),
    "params": model_lib.count_params(abstract_state["params"]),
    "global_batch": b,
    "seq_len": seq_len,
    "lower_seconds": t1 - t0,
    "compile_seconds": t2 - t1,
    # cost_analysis counts a scanned loop body once: the analytic count is the one to trust.
    "xla_flops_per_device": float(cost.get("flops", -1.0)),
    "model_flops_per_device": model_flops / len(devices),
    "hbm_bytes": topo.hbm_bytes if topo else None,
  }
  if mem is not None:
    out.update(
      argument_bytes=int(mem.argument_size_in_bytes),
      output_bytes=int(mem.output_size_in_bytes),
      temp_bytes=int(mem.temp_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes),
      code_bytes=int(mem.generated_code_size_in_bytes),
    )
    # Donated state aliases its outputs, so they are counted once.
    out["total_bytes"] = (
      out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    )
    if topo and out["total_bytes"] > topo.hbm_bytes:
      raise ValueError(
        f"does not fit: {topology} needs {out['total_bytes'] / GiB:.2f} GiB per device, "
        f"HBM is {topo.hbm_bytes / GiB:.0f} GiB"
      )
  return out


def _size(x: float) -> str:
  for unit, scale in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
    if x >= scale:
      return f"{x / scale:.2f} {unit}"
  return f"{int(x)} B"


def format_report(r: dict[str, Any]) -> str:
  lines = [
    f"{r['topology']}: {r['num_devices']} x {r['device_kind']}, mesh {r['mesh']}",
    f"  model {r['params'] / 1e6:.1f}M params, global batch {r['global_batch']} x "
    f"{r['seq_len']} tokens, kernels={r['kernels']}",
    f"  lower {r['lower_seconds']:.1f} s, compile {r['compile_seconds']:.1f} s",
  ]
  if "total_bytes" in r:
    lines += [
      "  per device:",
      f"    arguments {_size(r['argument_bytes'])}",
      f"    outputs   {_size(r['output_bytes'])} (aliasing donated arguments: "
      f"{_size(r['alias_bytes'])})",
      f"    temps     {_size(r['temp_bytes'])}",
    ]
    total = f"    total     {_size(r['total_bytes'])}"
    if r["hbm_bytes"]:
      total += (
        f" of {r['hbm_bytes'] / GiB:.0f} GiB HBM ({100 * r['total_bytes'] / r['hbm_bytes']:.1f}%)"
      )
    lines.append(total)
  lines.append(
    f"  FLOPs per device per step: model {r['model_flops_per_device']:.3e}, "
    f"XLA {r['xla_flops_per_device']:.3e} (XLA counts a scanned layer once)"
  )
  return "\n".join(lines)


_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "A config: a bundled name (local, bert_base, bert_large) or a path, each with [:ARG].",
  lock_config=True,
)
_TOPOLOGY = flags.DEFINE_string("topology", "cpu", "Named slice (v5e-16, 2xv5e-16, ...) or cpu.")
_MESH = flags.DEFINE_string("mesh", None, "(data,fsdp,tensor) override, e.g. '(1,-1,1)'.")
_CPU_DEVICES = flags.DEFINE_integer(
  "num_cpu_devices", None, "With --topology=cpu: fake this many CPU devices."
)
flags.mark_flags_as_required(["config"])
cli.check_flag(_TOPOLOGY, parse_topology)
cli.check_flag(_MESH, lambda text: text is None or parse_mesh(text))


def main(argv: list[str]) -> None:
  del argv
  import jax

  # The host must stay a CPU backend: libtpu only provides compile-only devices here.
  jax.config.update("jax_platforms", "cpu")
  if _CPU_DEVICES.value:
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  mesh = parse_mesh(_MESH.value) if _MESH.value else None
  print(format_report(compile_train_step(_CONFIG.value, _TOPOLOGY.value, mesh)))


def run() -> None:
  cli.run(main, "aot", check=lambda: config_schema.check_pretraining(_CONFIG.value))


if __name__ == "__main__":
  run()
