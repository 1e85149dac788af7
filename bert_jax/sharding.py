"""Logical axis names, default rules onto the ('data', 'fsdp', 'tensor') mesh, sharded init.

Every parameter is annotated with logical axis names (`nn.with_logical_partitioning`) and
every layer boundary with `nn.with_logical_constraint`; the rules below map those names onto
mesh axes. The same model code therefore runs on 1 CPU, 8 fake CPU devices or a TPU pod: only
the mesh shape and the rules change.

Use `jax.set_mesh(mesh)` (see `mesh_context`), never `with mesh:` -- in this JAX version the
latter silently turns every Flax activation constraint into a no-op.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
DATA_AXES = ("data", "fsdp")  # the batch dimension is split over both data-parallel axes

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
EMBED_OUT = "embed_out"  # output side of a hidden->hidden dense (pooler, MLM transform)
MLP = "mlp"
HEADS = "heads"
KV = "kv"
LAYERS = "layers"
# Activation axes.
ACT_BATCH = "act_batch"
ACT_LENGTH = "act_length"
ACT_EMBED = "act_embed"
ACT_MLP = "act_mlp"
ACT_HEADS = "act_heads"
ACT_KV = "act_kv"
ACT_VOCAB = "act_vocab"

Rules = tuple[tuple[str, Any], ...]

DEFAULT_RULES: Rules = (
  (ACT_BATCH, DATA_AXES),  # data parallelism: FSDP shards the batch too
  (ACT_LENGTH, None),  # sequences are short (128/512): no sequence parallelism
  (ACT_EMBED, None),  # hidden activations replicated over 'tensor' (Megatron-style)
  (ACT_MLP, "tensor"),  # FFN intermediate split over tensor parallelism
  (ACT_HEADS, "tensor"),  # attention heads split over tensor parallelism
  (ACT_KV, None),  # head dim stays whole
  # MLM logits are NOT constrained to 'tensor': in jax 0.10.2 that constraint, with the tied
  # table sharded ('tensor', 'fsdp'), gives wrong gradients on a (2,2,2) mesh (max error 0.2
  # in the embeddings; tests/unit/test_sharding.py guards it). They are small at the masked
  # positions (P = max_predictions, 20 at length 128, 80 at 512); an LTR model's cover every
  # position (P = L), a larger replicated [B, L, V] that the same bug rules out sharding.
  (ACT_VOCAB, None),
  (VOCAB, "tensor"),  # word embedding / decoder rows
  (EMBED, "fsdp"),  # every weight's hidden dim is FSDP-sharded (gathered per layer)
  (EMBED_OUT, "tensor"),  # hidden->hidden denses split on their output side
  (MLP, "tensor"),  # FFN weights split over tensor parallelism
  (HEADS, "tensor"),  # q/k/v/output weights split by head
  (KV, None),  # head dim stays whole
  (LAYERS, None),  # the scanned layer axis is never sharded
)


def rules_from_config(rules: Sequence[Sequence[Any]] | None) -> Rules:
  """Normalises rules read from an ml_collections config (lists become tuples)."""
  if rules is None:
    return DEFAULT_RULES
  out = []
  for rule in rules:
    if len(rule) != 2:
      raise ValueError(f"mesh rule {rule!r} must be (logical_name, mesh_axes)")
    name, axes = rule
    if isinstance(axes, list):
      axes = tuple(axes)
    for a in axes if isinstance(axes, tuple) else (axes,):
      if a is not None and a not in MESH_AXES:
        raise ValueError(f"mesh rule {rule!r} names unknown mesh axis {a!r}; use {MESH_AXES}")
    out.append((name, axes))
  return tuple(out)


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Fills one -1 entry so the mesh uses every device; errors name the mismatch."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != len(MESH_AXES):
    raise ValueError(f"mesh shape {shape} must have {len(MESH_AXES)} entries {MESH_AXES}")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh shape {shape} may contain at most one -1")
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh shape {shape} has a non-positive entry")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ValueError(
        f"mesh shape {shape}: {num_devices} devices are not divisible by the fixed axes ({known})"
      )
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != num_devices:
    raise ValueError(
      f"mesh shape {shape} needs {math.prod(shape)} devices but {num_devices} are available"
    )
  return shape


def make_mesh(shape: Sequence[int] = (1, -1, 1), devices: Sequence[Any] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh with Auto axes (Flax's logical constraints need Auto)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(shape, len(devices))
  try:  # topology-aware device order on TPU/GPU
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    return Mesh(np.array(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in DATA_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dim over ('data', 'fsdp'), everything else replicated."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def jit_step(step_fn: Callable[..., Any], mesh: Mesh, state_sh: Any) -> Callable[..., Any]:
  """`step_fn(state, batch, rng) -> (state, metrics)` jitted with explicit shardings (state as
  `state_sh`, batch over the data axes, rng and metrics replicated) and the state donated: the
  one way training, fine-tuning, the AOT check and the benchmark compile a step (trace it
  under `mesh_context`)."""
  return jax.jit(
    step_fn,
    in_shardings=(state_sh, batch_sharding(mesh), replicated(mesh)),
    out_shardings=(state_sh, replicated(mesh)),
    donate_argnums=0,
  )


def compile_ahead(jitted: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
  """Lowers `jitted` for `args` (ShapeDtypeStructs with shardings) here and compiles it in a
  thread; returns the compile's future. XLA's compile releases the GIL, so the caller goes on
  (a train state's init compiles and runs beside it), and the first call with arrays of those
  shapes and shardings finds the executable in JAX's compile cache instead of compiling it.
  Lower under `mesh_context`, as the call will trace; another spec only costs a compile."""
  lowered = jitted.lower(*args)
  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compile_ahead")
  future = pool.submit(lowered.compile)
  pool.shutdown(wait=False)
  return future


def jit_eval(eval_fn: Callable[..., Any], mesh: Mesh, params_sh: Any) -> Callable[..., Any]:
  """`eval_fn(params, batch) -> outputs` jitted with the params' shardings, the batch over the
  data axes and the outputs replicated (trace it under `mesh_context`)."""
  return jax.jit(
    eval_fn, in_shardings=(params_sh, batch_sharding(mesh)), out_shardings=replicated(mesh)
  )


def under_mesh(fn: Callable[..., Any], mesh: Mesh, rules: Rules) -> Callable[..., Any]:
  """`fn` called under `mesh_context(mesh, rules)`: a jitted step traces at its first call as it
  was built and lowered, with the activations' logical constraints in its program (only the
  call: the host code around it runs outside the mesh)."""

  @functools.wraps(fn)
  def call(*args: Any) -> Any:
    with mesh_context(mesh, rules):
      return fn(*args)

  return call


@contextlib.contextmanager
def mesh_context(mesh: Mesh, rules: Rules):
  """Mesh + logical rules for tracing; activation constraints are live inside."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
  """Drops the mesh axes of any dimension they do not divide (e.g. BERT's 30,522-row vocab
  over 8 tensor shards), replicating that dimension instead of failing."""
  out = []
  for i, axes in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = axes if isinstance(axes, tuple) else (axes,) if axes else ()
    size = math.prod(mesh.shape[a] for a in names)
    out.append(axes if size <= 1 or shape[i] % size == 0 else None)
  return PartitionSpec(*out)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings for a tree of (possibly abstract) LogicallyPartitioned leaves."""
  specs = nn.get_partition_spec(boxed_tree)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  unboxed = nn.meta.unbox(boxed_tree)
  return jax.tree.map(
    lambda s, x: NamedSharding(mesh, fit_spec(s.spec, x.shape, mesh)), shardings, unboxed
  )


def abstract_sharded(init_fn: Callable[..., Any], mesh: Mesh, rules: Rules, *args: Any):
  """(shardings, abstract unboxed tree carrying them) of `init_fn(*args)`: nothing runs."""
  boxed = jax.eval_shape(init_fn, *args)
  shardings = logical_shardings(boxed, mesh, rules)
  abstract = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.meta.unbox(boxed), shardings
  )
  return shardings, abstract


def sharded_init(init_fn: Callable[..., Any], shardings: Any) -> Callable[..., Any]:
  """`nn.meta.unbox(init_fn(*args))` jitted onto `shardings`, not yet run (call it, or lower
  and compile it ahead of time, under `mesh_context`)."""

  def sharded_init(*args):
    return nn.meta.unbox(init_fn(*args))

  return jax.jit(sharded_init, out_shardings=shardings)


def init_sharded(
  init_fn: Callable[..., Any], mesh: Mesh, rules: Rules, *args: Any
) -> tuple[Any, Any, Any]:
  """Materialises `nn.meta.unbox(init_fn(*args))` directly sharded.

  `init_fn` returns a tree with LogicallyPartitioned boxes (Flax params and, if it calls
  `tx.init` on the boxed params, the optimizer moments too). Returns (unboxed tree,
  shardings, abstract unboxed tree): nothing is ever materialised on one device first.
  """
  shardings, abstract = abstract_sharded(init_fn, mesh, rules, *args)
  with mesh_context(mesh, rules):
    tree = sharded_init(init_fn, shardings)(*args)
  return tree, shardings, abstract


def to_global(host_batch: dict[str, np.ndarray], mesh: Mesh, data_axes=DATA_AXES) -> dict:
  """Host batch -> global jax.Arrays sharded over data_axes on the batch dimension."""
  sharding = NamedSharding(mesh, PartitionSpec(data_axes))
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in host_batch.items()
  }
