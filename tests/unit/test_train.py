"""Trainer: sharded steps, gradient accumulation, exact resume, mesh changes, multi-process,
notebook reload and one-line config errors."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib, config_schema, masking, model_config, objectives, train
from bert_jax import model as model_lib
from bert_jax import sharding as sh
from bert_jax.data import input_pipeline
from bert_jax.runtime import checkpoints as ckpt_lib
from bert_jax.tokenizers import tokenizer as tokenizer_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)


def tiny_config(data_dir, **over):
  c = config_lib.base_config("tiny")
  c.model.update(TINY)
  c.data.dir = data_dir
  c.data.max_seq_length = 64
  c.data.batch_size = 8
  c.masking.max_predictions = 10
  c.opt.lr = 1e-3
  c.opt.total_steps = 6
  c.opt.warmup_steps = 1
  c.ckpt.every_steps = 3
  c.ckpt.async_save = False
  c.eval.every_steps = 0
  c.eval.max_batches = 2
  c.log.every_steps = 1
  for k, v in over.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


def _main_cmd(workdir, data_dir, steps=6, extra=()):
  flags = [
    f"--config={ROOT / 'configs' / 'local.py'}:size=tiny,steps={steps}",
    f"--workdir={workdir}",
    f"--config.data.dir={data_dir}",
    "--config.data.max_seq_length=64",
    "--config.data.batch_size=8",
    "--config.opt.lr=1e-3",  # what the resume tests expect to read back
    "--config.masking.max_predictions=10",
    "--config.model.hidden_size=32",
    "--config.model.intermediate_size=64",
    "--config.ckpt.every_steps=4",
    "--config.log.every_steps=1",
    "--config.eval.every_steps=0",
    "--config.eval.max_batches=2",
    # The fixture data uses BERT's vocab; these tests compare losses at fp32 tolerance.
    "--config.model.vocab_size=30522",
    "--config.model.dtype=float32",
    "--config.objective.nsp=True",  # the fixture data has NSP pairs
  ]
  return [sys.executable, "-m", "bert_jax.main", *flags, *extra]


def _env(**extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  # Only conftest's -O0 (compile time); no device-count flags from the caller's environment.
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
  env.update(extra)
  return env


def _params(workdir):
  meta, step, _ = ckpt_lib.read_meta(workdir)
  cfg = ckpt_lib.bert_config_from_meta(meta)
  target = ckpt_lib.single_device_target(model_lib.abstract_params(cfg))
  params, _ = ckpt_lib.restore_params(workdir, target)
  return step, jax.tree.map(np.asarray, params)


def _rows(workdir, split="train"):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["split"] == split]


# ----------------------------------------------------------------------------- in-process


def _loss_and_grads(shape, params, batch, model, obj, tables, rules=sh.DEFAULT_RULES):
  def lossf(p, b):
    inputs = objectives.prepare(b, obj, tables)
    out = objectives.forward(model, p, inputs, deterministic=True)
    return objectives.total_loss(
      objectives.losses(out, inputs, obj), objectives.counts(inputs, obj), obj
    )

  if shape is None:
    return jax.jit(jax.value_and_grad(lossf))(params, batch)
  mesh = sh.make_mesh(shape)
  boxed = jax.eval_shape(lambda r: model_lib.init_params(model, r), jax.random.key(0))
  psh = sh.logical_shardings(boxed, mesh, rules)
  with sh.mesh_context(mesh, rules):
    p = jax.device_put(params, psh)
    b = jax.device_put(batch, sh.batch_sharding(mesh))
    return jax.jit(jax.value_and_grad(lossf))(p, b)


def _synthetic_batch(b=8, length=32, vocab=30522, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1000, vocab, (b, length)).astype(np.int32)
  ids[:, 0], ids[:, 15], ids[:, -1] = 101, 102, 102
  mask = np.ones((b, length), np.int32)
  ids[b // 2 :, 20:], mask[b // 2 :, 20:] = 0, 0
  ids[b // 2 :, 19] = 102
  seg = np.zeros_like(ids)
  seg[:, 16:] = 1
  return dict(
    input_ids=ids,
    segment_ids=seg * mask,
    input_mask=mask,
    next_sentence_label=rng.integers(0, 2, b).astype(np.int32),
    example_id=np.arange(b, dtype=np.int32),
    epoch=np.zeros(b, np.int32),
  )


def test_pretraining_gradients_equal_on_meshes():
  """The whole objective (on-device masking, gathered MLM head over BERT's real 30,522 vocab,
  NSP) has the same gradients on (2,2,2) as on one device. Regression: constraining the
  gathered MLM logits to 'tensor' mis-compiled here in jax 0.10.2 (errors ~0.2)."""
  cfg = model_config.BertConfig(
    vocab_size=30522, **TINY, hidden_dropout_prob=0.0, attention_dropout_prob=0.0
  )
  model = model_lib.BertForPreTraining(cfg)
  obj = objectives.Objective()
  tables = masking.tables_from_tokenizer(
    tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())
  )
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda a: (0.02 * rng.standard_normal(a.shape)).astype(np.float32),
    model_lib.abstract_params(cfg),
  )
  batch = _synthetic_batch()
  ref_loss, ref_grads = _loss_and_grads(None, params, batch, model, obj, tables)
  loss, grads = _loss_and_grads((2, 2, 2), params, batch, model, obj, tables)
  assert abs(float(loss) - float(ref_loss)) < 1e-5
  diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads, ref_grads)
  assert max(jax.tree.leaves(diffs)) < 1e-5, diffs


@pytest.mark.parametrize(
  "over, message",
  [
    ({"data.batch_size": 6, "mesh.shape": (8, 1, 1)}, "not divisible by the data-parallel size 8"),
    (
      {"data.batch_size": 8, "opt.grad_accum_steps": 3},
      "batch_size=8: must be a multiple of config.opt.grad_accum_steps=3",
    ),
    ({"model.vocab_size": 1000}, "does not match the data's tokenizer"),
    ({"mesh.shape": (4, 4, 1)}, "needs 16 devices but 8 are available"),
    ({"data.max_seq_length": 128}, "built with max_seq_length=64"),
  ],
)
def test_config_errors_before_compute(tiny_data_dir, tmp_path, over, message):
  """A ConfigError (exit status 2 from the command line) before the workdir is made."""
  with pytest.raises(config_schema.ConfigError, match=message):
    train.train_and_evaluate(tiny_config(tiny_data_dir, **over), str(tmp_path / "wd"))
  assert not os.path.exists(tmp_path / "wd")


def test_max_seq_length_is_compared_with_the_data_built_into_the_workdir_too(tiny_data_dir):
  """The data's max_seq_length is the config's whether config.data.dir names the data or the
  run built it into its workdir (a rerun with another length finds the old data there)."""
  config = tiny_config(tiny_data_dir, **{"data.max_seq_length": 128})
  config.data.dir = ""
  metadata = input_pipeline.read_metadata(tiny_data_dir)
  mesh = sh.make_mesh(tuple(config.mesh.shape))
  match = "max_seq_length=128 but the workdir's data was built with max_seq_length=64"
  with pytest.raises(config_schema.ConfigError, match=match):
    train.validate(config, mesh, metadata)
  config.data.max_seq_length = 64
  train.validate(config, mesh, metadata)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_two_processes(workdir, data_dir, steps, extra=(), timeout=400):
  """`_main_cmd` as 2 jax.distributed processes x 4 CPU devices over localhost; returns
  [(returncode, stdout, stderr)] of both."""
  port = _free_port()
  dist = ["--distributed", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2"]
  procs = [
    subprocess.Popen(
      _main_cmd(
        workdir, data_dir, steps, ["--num_cpu_devices=4", *extra, *dist, f"--process_id={i}"]
      ),
      env=_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=timeout) for p in procs]
  return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


class _FixedPredictor:
  """Stands in for BertForPreTraining in make_eval_step: predicts either the token it was given
  at each masked position ('copy') or the true target ('oracle')."""

  def __init__(self, vocab, mode, targets=None):
    self.cfg = model_config.BertConfig(vocab_size=vocab, **TINY)
    self.mode, self.targets = mode, targets

  def apply(self, variables, input_ids, segment_ids, input_mask, positions, **kw):
    pred = jnp.take_along_axis(input_ids, positions, 1) if self.mode == "copy" else self.targets
    return {
      "mlm_logits": jax.nn.one_hot(pred, self.cfg.vocab_size),
      "nsp_logits": jnp.zeros((input_ids.shape[0], 2)),
    }


def test_eval_accuracy_at_mask_counts_only_mask_replaced_targets():
  tok = tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())
  tables = masking.tables_from_tokenizer(tok)
  obj = objectives.Objective()
  batch = _synthetic_batch(b=64, length=64)
  inputs = objectives.prepare(batch, obj, tables)
  shown = np.take_along_axis(np.asarray(inputs["input_ids"]), np.asarray(inputs["positions"]), 1)
  w = np.asarray(inputs["target_weights"])
  n_mask = float(np.sum(w * (shown == tok.mask_id)))
  n_kept = float(np.sum(w * (shown == np.asarray(inputs["targets"]))))
  assert 0.7 < n_mask / w.sum() < 0.9 and 0.05 < n_kept / w.sum() < 0.15

  copy = train.make_eval_step(_FixedPredictor(tok.vocab_size, "copy"), obj, tables)(None, batch)
  # Copying the input is right exactly at the targets left unchanged, never at a [MASK].
  assert float(copy["mlm_at_mask_count"]) == n_mask and float(copy["mlm_at_mask_correct"]) == 0
  assert float(copy["mlm_correct"]) == n_kept

  oracle = _FixedPredictor(tok.vocab_size, "oracle", inputs["targets"])
  sums = train.make_eval_step(oracle, obj, tables)(None, batch)
  assert float(sums["mlm_at_mask_correct"]) == n_mask
  summary = objectives.summarize({k: float(v) for k, v in sums.items() if k != "target_hist"})
  assert summary["mlm_accuracy_at_mask"] == 1.0


def test_batch_spec_is_the_global_batch_the_pipeline_yields(tiny_data_dir):
  """The train step the trainer compiles ahead (train.batch_spec) is the program its first
  batch calls: the same fields, shapes, dtypes and sharding."""
  c = tiny_config(tiny_data_dir)
  mesh = sh.make_mesh((2, 2, 2), jax.devices())
  spec = train.batch_spec(c, input_pipeline.read_metadata(tiny_data_dir), mesh)
  host = next(iter(train.train_dataset(c, tiny_data_dir, worker_count=0)))
  batch = sh.to_global(host, mesh)
  assert {k: (v.shape, v.dtype, v.sharding) for k, v in batch.items()} == {
    k: (s.shape, s.dtype, s.sharding) for k, s in spec.items()
  }
  assert spec["input_ids"].shape == (8, 64)


def test_a_new_run_compiles_its_train_step_once_ahead_of_the_first_batch(
  tiny_data_dir, tmp_path, backend_compiles
):
  """The step compiled in a thread beside the state's init (sharding.compile_ahead) is the one
  the first batch runs: the run compiles `train_step` exactly once. A resumed run restores
  without initialising a state (no `sharded_init` compile) and compiles its step at the first
  batch."""
  train.train_and_evaluate(tiny_config(tiny_data_dir, **{"opt.total_steps": 3}), str(tmp_path))
  first = list(backend_compiles)
  backend_compiles.clear()
  out = train.train_and_evaluate(
    tiny_config(tiny_data_dir, **{"opt.total_steps": 6}), str(tmp_path)
  )
  assert first.count("jit(train_step)") == 1, first
  assert first.count("jit(sharded_init)") == 1, first
  assert out["step"] == 6
  assert backend_compiles.count("jit(train_step)") == 1, backend_compiles
  assert "jit(sharded_init)" not in backend_compiles, backend_compiles
