"""bert_jax.backends.flash in Pallas' interpreter: the same outputs and gradients as the
explicit attention (backends.attention.explicit_attention) with the same mask and the same hash
dropout (backends.dropout.Dropout with dropout_rng='hash'), on one device and sharded; the
kernels lower for CUDA through Pallas' Triton backend; and the model with
attention_impl='flash' trains as with 'explicit' and dropout_rng='hash'."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from unit.test_backends_cpu import _micro_config, _train_batch

from bert_jax import aot, backends, model_config, objectives, optim, train
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax.backends import attention as attention_lib
from bert_jax.backends import dropout as dropout_lib
from bert_jax.backends import flash as flash_lib
from bert_jax.backends.flash import flash_attention
from bert_jax.model import BertForPreTraining
from bert_jax.model_config import BertConfig
from lab._cuda_program import lowered_for_cuda, pallas_calls, triton_calls

GRADS = ("dq", "dk", "dv")


def _inputs(b, q_len, s, h, k, dtype=jnp.float32, seed=0):
  kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(kq, (b, q_len, h, k), jnp.float32).astype(dtype)
  keys = jax.random.normal(kk, (b, s, h, k), jnp.float32).astype(dtype)
  values = jax.random.normal(kv, (b, s, h, k), jnp.float32).astype(dtype)
  cotangent = jax.random.normal(kg, (b, q_len, h, k), jnp.float32).astype(dtype)
  return q, keys, values, cotangent


def _input_mask(b, s):
  """Row 0 whole, row 1 padded after 3/5 of its keys, row 2 (if any) all padding: its rows are
  fully masked."""
  mask = np.ones((b, s), np.int32)
  mask[1, (3 * s) // 5 :] = 0
  if b > 2:
    mask[2] = 0
  return jnp.asarray(mask)


def _hash_dropout(rate, key):
  """model.Dropout with dropout_rng='hash' bound to `key`, and the seed words its first mask
  hashes with (its first make_rng)."""
  drop = lambda: dropout_lib.Dropout(rate, "hash").bind({}, rngs={"dropout": key})
  return drop(), dropout_lib.hash_seed(drop().make_rng("dropout"))


def explicit(q, k, v, input_mask, causal, positions, rate, key):
  drop = _hash_dropout(rate, key)[0] if rate > 0 else None
  mask = attention_lib.attention_mask(input_mask, causal, positions)
  return attention_lib.explicit_attention(q, k, v, mask, backends.XLA_OPS, drop)[0]


def flash(q, k, v, input_mask, causal, positions, rate, key, **kw):
  seed = _hash_dropout(rate, key)[1] if rate > 0 else None
  return flash_attention(
    q,
    k,
    v,
    input_mask,
    causal=causal,
    query_positions_BQ=positions,
    dropout_rate=rate,
    dropout_seed=seed,
    interpret=True,
    **kw,
  )


def _out_and_grads(fn, q, k, v, g, *args):
  """fn's output and the VJP of <output, g> with respect to q, k, v (one compile)."""

  @jax.jit
  def run(q, k, v, g):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, *args), q, k, v)
    return out, vjp(g)

  return run(q, k, v, g)


def _assert_close(got, want, what, atol, rtol=0.0):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=what)


# (B, Q, S, H, K, causal, pruned queries, dropout rate). 'pad': S=40 is not a multiple of the
# 16-key tile (padded keys must stay out of a fully masked row's uniform softmax). 'pruned':
# queries at [CLS] + 20 positions (Q=21 padded to 32 inside), as the pruned last layer;
# 'pruned_causal' the same under the causal mask, with a head dim (24) padded to 32.
CASES = {
  "pad": (3, 40, 40, 2, 16, False, False, 0.2),
  "causal_nodrop": (3, 64, 64, 2, 32, True, False, 0.0),
  "pruned": (2, 21, 64, 2, 16, False, True, 0.2),
  "pruned_causal": (3, 21, 64, 2, 24, True, True, 0.1),
}


def _positions(b, q_len, s, seed=7):
  """[CLS] then q_len - 1 distinct positions per row, unsorted (as the masked positions)."""
  rng = np.random.default_rng(seed)
  rows = [np.concatenate([[0], rng.permutation(np.arange(1, s))[: q_len - 1]]) for _ in range(b)]
  return jnp.asarray(np.stack(rows), jnp.int32)


@pytest.mark.parametrize("case", CASES)
def test_equals_explicit_attention_float32(case):
  b, q_len, s, h, k, causal, pruned, rate = CASES[case]
  q, keys, values, g = _inputs(b, q_len, s, h, k)
  input_mask = _input_mask(b, s)
  positions = _positions(b, q_len, s) if pruned else None
  key = jax.random.key(11)
  args = (input_mask, causal, positions, rate, key)
  want, want_grads = _out_and_grads(explicit, q, keys, values, g, *args)
  got, got_grads = _out_and_grads(flash, q, keys, values, g, *args)
  _assert_close(got, want, "output", atol=2e-6, rtol=1e-5)
  for name, x, y in zip(GRADS, got_grads, want_grads, strict=True):
    _assert_close(x, y, name, atol=5e-6, rtol=1e-5)
  # Fully masked rows (row 2) are uniform over the S keys, as the explicit path's softmax.
  if b > 2 and rate == 0.0:
    _assert_close(got[2], jnp.broadcast_to(values[2].mean(0), got[2].shape), "uniform", 1e-5)


@pytest.mark.parametrize("case", ["pad", "pruned_causal"])
def test_one_pass_backward_equals_explicit_attention(case):
  """BlockSizes.one_pass_bwd: the dK/dV kernel also writes each key block's share of dQ (here
  3 key blocks of 16 at S=40, 4 at S=64), summed outside; the same gradients as the explicit
  path and as the two-kernel backward (the dQ shares summed in another order)."""
  b, q_len, s, h, k, causal, pruned, rate = CASES[case]
  q, keys, values, g = _inputs(b, q_len, s, h, k)
  positions = _positions(b, q_len, s) if pruned else None
  args = (_input_mask(b, s), causal, positions, rate, jax.random.key(11))
  one_pass = functools.partial(
    flash, blocks=flash_lib.BlockSizes(dkv_k=16, dkv_q=16, one_pass_bwd=True)
  )
  want, want_grads = _out_and_grads(explicit, q, keys, values, g, *args)
  got, got_grads = _out_and_grads(one_pass, q, keys, values, g, *args)
  two_pass = _out_and_grads(flash, q, keys, values, g, *args)[1]
  _assert_close(got, want, "output", atol=2e-6, rtol=1e-5)
  for name, x, y, z in zip(GRADS, got_grads, want_grads, two_pass, strict=True):
    _assert_close(x, y, name, atol=5e-6, rtol=1e-5)
    _assert_close(x, z, name + " against two kernels", atol=2e-6, rtol=1e-5)


def test_equals_explicit_attention_bfloat16():
  b, q_len, s, h, k = 3, 64, 64, 2, 32
  q, keys, values, g = _inputs(b, q_len, s, h, k, jnp.bfloat16)
  args = (_input_mask(b, s), False, None, 0.2, jax.random.key(5))
  want, want_grads = _out_and_grads(explicit, q, keys, values, g, *args)
  got, got_grads = _out_and_grads(flash, q, keys, values, g, *args)
  assert got.dtype == jnp.bfloat16 and all(x.dtype == jnp.bfloat16 for x in got_grads)
  # The kernels round the probabilities and ds to bf16 before their dots, where the explicit
  # path's backward dots see float32 cotangents: one bf16 ulp (2**-8 relative) of the largest
  # value apart (measured: 0.0078 at 1.4-1.6); the bound is two.
  scale = lambda x: float(jnp.abs(x.astype(jnp.float32)).max())
  _assert_close(got, want, "output", atol=1e-2 * scale(want))
  for name, x, y in zip(GRADS, got_grads, want_grads, strict=True):
    _assert_close(x, y, name, atol=1e-2 * scale(y))


def test_dropout_masks_follow_the_key_and_rate_zero_is_no_dropout():
  b, q_len, s, h, k = 2, 32, 32, 2, 16
  q, keys, values, _ = _inputs(b, q_len, s, h, k)
  input_mask = _input_mask(b, s)

  run = jax.jit(
    lambda seed: flash_attention(
      q, keys, values, input_mask, dropout_rate=0.3, dropout_seed=seed, interpret=True
    )
  )
  seeds = [_hash_dropout(0.3, jax.random.key(i))[1] for i in (1, 2)]
  one, two = run(seeds[0]), run(seeds[1])
  none = flash(q, keys, values, input_mask, False, None, 0.0, None)
  want_none = explicit(q, keys, values, input_mask, False, None, 0.0, None)
  _assert_close(none, want_none, "rate 0", atol=2e-6, rtol=1e-5)
  for dropped in (one, two):
    assert float(jnp.abs(dropped - none).max()) > 0.1
  assert float(jnp.abs(one - two).max()) > 0.1
  # Each key's mask is keep_mask's: the explicit path with that key gives the same output.
  _assert_close(one, explicit(q, keys, values, input_mask, False, None, 0.3, jax.random.key(1)),
                "key 1", atol=2e-6, rtol=1e-5)  # fmt: skip


def test_sharded_equals_unsharded_and_explicit():
  """On a (2, 2, 2) mesh, batch over ('data', 'fsdp') and heads over 'tensor' (the logical
  rules' placement): each shard hashes its global indices, so the masks are the global ones."""
  b, q_len, s, h, k = 4, 32, 32, 2, 16
  q, keys, values, g = _inputs(b, q_len, s, h, k)
  input_mask = jnp.asarray(np.r_[_input_mask(3, s), np.ones((1, s), np.int32)])
  args = (input_mask, False, None, 0.2, jax.random.key(3))
  want, want_grads = _out_and_grads(explicit, q, keys, values, g, *args)
  single, single_grads = _out_and_grads(flash, q, keys, values, g, *args)

  mesh = sh.make_mesh((2, 2, 2))
  seq = NamedSharding(mesh, PartitionSpec(sh.DATA_AXES, None, "tensor", None))
  placed = [jax.device_put(x, seq) for x in (q, keys, values, g)]
  sharded_flash = functools.partial(flash, batch_axes=sh.DATA_AXES, head_axes="tensor")
  with jax.set_mesh(mesh):
    run = jax.jit(
      lambda q, k, v, g: jax.vjp(lambda q, k, v: sharded_flash(q, k, v, *args), q, k, v)
    )
    traced = jax.make_jaxpr(lambda *x: run(*x)[0])(*placed)
    got, vjp = run(*placed)
    got_grads = vjp(placed[3])
  assert "shard_map" in str(traced)  # the kernels ran per shard
  _assert_close(got, single, "sharded output", atol=1e-6)
  _assert_close(got, want, "output", atol=2e-6, rtol=1e-5)
  for name, x, y, z in zip(GRADS, got_grads, single_grads, want_grads, strict=True):
    _assert_close(x, y, name + " sharded", atol=1e-6)
    _assert_close(x, z, name, atol=5e-6, rtol=1e-5)


@pytest.mark.parametrize(
  "dtype, one_pass", [(jnp.bfloat16, False), (jnp.float32, False), (jnp.bfloat16, True)]
)
def test_lowers_for_cuda_with_triton(dtype, one_pass):
  """The forward and both backward kernels (or, one_pass_bwd, the one) lower through Pallas'
  Triton backend for a CUDA device (from this CPU host: an unsupported op in a kernel fails
  here). Triton's own compile to PTX happens only on a GPU."""
  b, q_len, s, h, k = 2, 21, 128, 2, 64
  q, keys, values, g = _inputs(b, q_len, s, h, k, dtype)
  input_mask, positions = _input_mask(b, s), _positions(b, q_len, s)
  seed = dropout_lib.hash_seed(jax.random.key(0))

  def step(q, k, v, g):
    fn = lambda q, k, v: flash_attention(
      q, k, v, input_mask, causal=True, query_positions_BQ=positions, dropout_rate=0.1,
      dropout_seed=seed, blocks=flash_lib.BlockSizes(one_pass_bwd=one_pass),
    )  # fmt: skip
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(g)

  text = jax.jit(step).trace(q, keys, values, g).lower(lowering_platforms=("cuda",)).as_text()
  triton_calls = text.count("__gpu$xla.gpu.triton")
  assert triton_calls == (2 if one_pass else 3), triton_calls  # forward, dK/dV (+ dQ), dQ
  assert "mosaic_gpu" not in text


def test_identical_calls_share_one_trace_and_one_lowering():
  """Two layers' attention of the same shapes: each kernel is traced and lowered once (the
  forward and backward are jitted on their static configuration) and called twice, so a
  deep model's lowering does not grow with its depth (BERT-Large 128 x 256 from this CPU
  host: 13.1 s to trace and lower for CUDA with a Pallas lowering per call, 5.5 s shared)."""
  b, s, h, k = 2, 64, 2, 32
  q, keys, values, g = _inputs(b, s, s, h, k, jnp.bfloat16)
  input_mask, seed = _input_mask(b, s), dropout_lib.hash_seed(jax.random.key(0))
  attend = functools.partial(
    flash_attention, input_mask_BS=input_mask, dropout_rate=0.1, dropout_seed=seed
  )

  def two_layers(q, k, v, g):
    out, vjp = jax.vjp(lambda q, k, v: attend(attend(q, k, v), k, v), q, k, v)
    return out, vjp(g)

  traced = jax.jit(two_layers).trace(q, keys, values, g)
  assert pallas_calls(traced.jaxpr) == 6  # forward, dK/dV, dQ, for each layer
  text = traced.lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 3 and triton_calls(text) == 6


# --- the model ---------------------------------------------------------------------------------


def _train_step_results(c, mesh_shape):
  """One step of the jitted train step (train.jit_train_step) for config `c` resolved for the
  CPU: its metrics, its Adam first moments (after one step, (1 - b1) times the clipped
  gradients) by parameter path, and whether its program holds a Pallas kernel."""
  mesh = sh.make_mesh(mesh_shape, jax.devices()[: int(np.prod(mesh_shape))])
  cfg = backends.resolve_kernels(train.bert_config(c), "cpu")
  model = BertForPreTraining(cfg)
  tx = optim.make_optimizer(c.opt)
  obj = objectives.Objective.from_config(c)
  tables = aot._masking_tables(c)
  state, state_sh, _ = train.create_state(c, model, tx, mesh, sh.DEFAULT_RULES, jax.random.key(0))
  batch = jax.device_put(_train_batch(0), sh.batch_sharding(mesh))
  with sh.mesh_context(mesh, sh.DEFAULT_RULES):
    step = train.jit_train_step(model, tx, obj, tables, 1, mesh, state_sh)
    pallas = "pallas_call" in str(jax.make_jaxpr(step)(state, batch, jax.random.key(3)))
    state, metrics = step(state, batch, jax.random.key(3))
  moments = {
    jax.tree_util.keystr(path): np.asarray(x)
    for path, x in jax.tree_util.tree_leaves_with_path(state["opt_state"])
    if ".mu[" in jax.tree_util.keystr(path)
  }
  return jax.tree.map(float, metrics), moments, pallas


@pytest.mark.slow
@pytest.mark.parametrize("objective,mesh_shape", [("mlm", (2, 2, 2)), ("ltr", (1, 1, 1))])
def test_model_flash_equals_explicit_with_hash_dropout(objective, mesh_shape):
  """BERT-tiny (float32, dropout 0.1, dropout_rng='hash'): one train step with
  attention_impl='flash' has the loss, gradient norm and (clipped) gradients of 'explicit'.
  MLM runs the pruned last layer (queries at [CLS] + the masked positions) on a (2, 2, 2) mesh
  (the kernels per batch and head shard), LTR the causal mask."""
  results = {}
  for impl in ("explicit", "flash"):
    c = _micro_config("auto", dropout=0.1)
    c.model.update(dropout_rng="hash", attention_impl=impl)
    if objective == "ltr":
      c.objective.update(mlm=False, nsp=False, ltr=True)
    results[impl] = _train_step_results(c, mesh_shape)
  (metrics_e, moments_e, pallas_e), (metrics_f, moments_f, pallas_f) = results.values()
  assert pallas_f and not pallas_e
  for name in ("loss", "grad_norm"):
    assert metrics_f[name] == pytest.approx(metrics_e[name], rel=1e-5), name
  assert moments_f.keys() == moments_e.keys() and len(moments_e) > 20
  floor = 1e-3 * max(float(np.abs(m).max()) for m in moments_e.values())
  for path, m in moments_e.items():
    np.testing.assert_allclose(moments_f[path], m, rtol=1e-4, atol=floor, err_msg=path)


def test_scanned_rematerialised_layers_flash_equals_explicit():
  """Scanned layers (per-layer dropout rngs split by nn.scan) under full remat: 'flash' gives
  the loss and gradients of 'explicit' with dropout_rng='hash'."""
  cfg = model_config.config_for_size(
    "tiny", vocab_size=64, max_position_embeddings=16, dropout_rng="hash", scan_layers=True,
    remat_policy="full",
  )  # fmt: skip
  ids = jnp.arange(32).reshape(2, 16) % 64
  input_mask = jnp.ones((2, 16), jnp.int32).at[1, 10:].set(0)
  params = model_lib.init_params(BertForPreTraining(cfg), jax.random.key(0))
  results = []
  for impl in ("explicit", "flash"):
    model = BertForPreTraining(dataclasses.replace(cfg, attention_impl=impl))

    def loss(p, model=model):
      out = model.apply(
        {"params": p}, ids, None, input_mask, deterministic=False,
        rngs={"dropout": jax.random.key(2)},
      )  # fmt: skip
      return jnp.sum(out["mlm_logits"] ** 2) * 1e-3

    results.append(jax.jit(jax.value_and_grad(loss))(params))
  (loss_e, grads_e), (loss_f, grads_f) = results
  assert float(loss_f) == pytest.approx(float(loss_e), rel=1e-6)
  for x, y in zip(jax.tree.leaves(grads_f), jax.tree.leaves(grads_e), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_train_step_lowers_for_cuda_with_triton():
  """BERT-tiny's train step with 'auto' attention and dropout and XLA's LayerNorm (bf16,
  dropout 0.1), resolved for a GPU, lowers for CUDA with the flash kernels: three Triton
  kernels a layer (forward, dK/dV, dQ), not interpreted (with the GPU's 'auto' kernels, the
  fused LayerNorm's four more: test_backends_fused_norm)."""
  cfg, text = lowered_for_cuda("xla")
  assert triton_calls(text) == 3 * cfg.num_layers


def test_flash_config():
  """'flash' is a valid attention_impl with attention dropout, 'auto''s choice on GPUs only;
  the model refuses it on a TPU in one line."""
  cfg = BertConfig(attention_impl="flash", attention_dropout_prob=0.1)
  assert backends.attention_choice(cfg, 128, dropout=True, probs=False) == "flash"
  assert backends.attention_choice(cfg, 128, dropout=True, probs=True) == "explicit"
  assert {p for p, _ in backends.AUTO_ATTENTION if "flash" in backends.AUTO_ATTENTION[p, _]} == {
    "gpu"
  }
  tpu = backends.resolve_kernels(dataclasses.replace(cfg, vocab_size=64), "tpu")
  model = BertForPreTraining(dataclasses.replace(tpu, num_layers=1, hidden_size=32, num_heads=2))
  ids = jnp.zeros((1, 8), jnp.int32)
  with pytest.raises(ValueError, match="^attention_impl='flash' runs on GPUs .* not on tpu"):
    jax.eval_shape(
      lambda: model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, ids,
                         deterministic=False)
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["classification", "span_qa"])
def test_finetuning_flash_equals_explicit_with_padding(kind):
  """Fine-tuning's model (tasks.heads.FinetuneModel) on a padded batch as fine-tuning feeds it
  (rows of 128, 96 and 17 real tokens and one of 128), dropout 0.1 with dropout_rng='hash':
  attention_impl='flash' (interpreted) gives explicit's logits and gradients. The pooled kind
  runs its last layer at [CLS] only (a query block of 1), span_qa at every position."""
  from bert_jax.tasks import heads

  cfg = model_config.config_for_size(
    "tiny", vocab_size=64, max_position_embeddings=128, dropout_rng="hash", platform="cpu",
    kernels="xla",
  )  # fmt: skip
  lengths = np.array([128, 96, 17, 128])
  input_mask = jnp.asarray((np.arange(128)[None] < lengths[:, None]).astype(np.int32))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (4, 128))) * input_mask
  segments = (jnp.arange(128)[None] >= 40) * input_mask
  outputs = 3 if kind == "classification" else 2
  params = heads.FinetuneModel(cfg, kind, outputs).init(jax.random.key(0), ids)["params"]
  results = []
  for impl in ("explicit", "flash"):
    model = heads.FinetuneModel(dataclasses.replace(cfg, attention_impl=impl), kind, outputs)

    def loss(p, model=model):
      logits = model.apply(
        {"params": p}, ids, segments, input_mask, deterministic=False,
        rngs={"dropout": jax.random.key(4)},
      )  # fmt: skip
      return jnp.sum(jnp.sin(logits)), logits

    jaxpr = str(jax.make_jaxpr(jax.grad(loss, has_aux=True))(params))
    assert ("pallas_call" in jaxpr) == (impl == "flash")
    results.append(jax.jit(jax.value_and_grad(loss, has_aux=True))(params))
  ((_, logits_e), grads_e), ((_, logits_f), grads_f) = results
  scale = float(jnp.abs(logits_e).max())
  _assert_close(logits_f, logits_e, "logits", atol=1e-5 * scale)
  # The dropout masks are in play: without them the logits are others.
  plain = heads.FinetuneModel(cfg, kind, outputs).apply(
    {"params": params}, ids, segments, input_mask
  )
  assert float(jnp.abs(plain - logits_e).max()) > 1e-2 * scale
  for x, y in zip(jax.tree.leaves(grads_f), jax.tree.leaves(grads_e), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
