"""The one checkpoint loader: a trained run exported to HuggingFace and back, HuggingFace
models in the notebook API, continued pretraining from HuggingFace weights, and one-line errors.

Golden fixture tests/fixtures/hf/roundtrip/ (tests/fixtures/make_hf_fixtures.py): a short run of the
bundled default exported by `convert`, with transformers' fill-mask top-5, corpus token ids
(digest), hidden states and MLM+NSP loss on the trainer's first batch. Without torch the tests
compare against it; with torch + transformers importable they also run transformers live.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import bert_jax
from bert_jax import model as model_lib
from bert_jax import model_config, params_tree, train
from bert_jax.interop import hf_io, loader
from bert_jax.tokenizers import files as tokenizer_files
from unit._hf_fixture import (
  FIXTURE,
  HF_TOKENIZER_FILES,
  LIVE,
  REPO,
  _check_fill_mask,
  _check_hidden,
  _digest,
  _fill_mask_ids,
  _one_line,
  _reference,
  _same_files,
  mk,
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """The bundled default (configs/local.py, shrunk), pretrained for a few steps."""
  wd = tmp_path_factory.mktemp("run") / "workdir"
  train.train_and_evaluate(mk.roundtrip_config(steps=100), str(wd))
  return wd


@pytest.fixture(scope="module")
def nsp_data(tmp_path_factory):
  """MLM+NSP data under the fixture's vocab, for continued pretraining."""
  return mk.build_nsp_data(str(FIXTURE / "vocab.txt"), str(tmp_path_factory.mktemp("nsp") / "d"))


# --- A run exported to HuggingFace ------------------------------------------------------------


def test_round_trip_workdir_to_hf(workdir, tmp_path):
  hf = tmp_path / "hf"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  cmd = [sys.executable, "-m", "bert_jax.convert", f"--src={workdir}", f"--dst={hf}"]
  done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
  assert done.returncode == 0, done.stderr
  assert sorted(os.listdir(hf)) == sorted(
    ["config.json", "model.safetensors", "special_tokens_map.json", *HF_TOKENIZER_FILES]
  )
  umask = os.umask(0)
  os.umask(umask)
  assert {os.stat(p).st_mode & 0o777 for p in [hf, *hf.iterdir()]} <= {
    0o777 & ~umask,
    0o666 & ~umask,
  }
  ours = bert_jax.load(workdir)
  back = bert_jax.load(hf)
  assert (ours.format, back.format, back.step) == ("workdir", "hf", None)
  # The tokenizer files are what tokenizer_files writes for the run's tokenizer, and read back
  # equal.
  _same_files(hf, tokenizer_files.hf_tokenizer_files(ours.tokenizer, ours.config))
  assert back.tokenizer.fingerprint == ours.tokenizer.fingerprint
  digest = _digest(ours.tokenizer)
  assert _digest(back.tokenizer) == digest
  # Weights: the export predicts and embeds as the workdir does.
  _check_fill_mask(_fill_mask_ids(back), _fill_mask_ids(ours), atol=1e-6)
  layers = tuple(range(ours.config.num_layers + 1))
  for a, b in zip(
    ours.embed(list(mk.EMBED_TEXTS), layers).hidden,
    back.embed(list(mk.EMBED_TEXTS), layers).hidden,
    strict=True,
  ):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  if LIVE:  # transformers itself on this export
    ref, hidden = mk.hf_reference(hf)
    assert ref["loading_info"] == {
      "missing_keys": [],
      "unexpected_keys": [],
      "mismatched_keys": [],
      "error_msgs": [],
    }
    assert ref["tokenizer_class"] == "BertTokenizerFast"
    assert ref["ids_digest"] == digest
    _check_fill_mask(_fill_mask_ids(ours), ref["fill_mask"], atol=1e-4)
    _check_hidden(ours, hidden, atol=1e-5)


# --- A HuggingFace dir in the notebook API ----------------------------------------------------


def test_load_hf_dir_matches_transformers():
  ref, hidden = _reference()
  m = bert_jax.load(FIXTURE)
  assert m.format == "hf" and m.has_heads and m.tokenizer.vocab_size == 4096
  _check_fill_mask(_fill_mask_ids(m), ref["fill_mask"], atol=1e-5)
  _check_hidden(m, hidden, atol=1e-5)
  # Not trivial: predictions differ between masks and the states vary.
  assert ref["fill_mask"][0][0][0][1] > 0.01 and np.std(hidden["text_0"]) > 0.1
  if LIVE:
    live, live_hidden = mk.hf_reference(FIXTURE)
    assert live["ids_digest"] == ref["ids_digest"]
    _check_fill_mask(_fill_mask_ids(m), live["fill_mask"], atol=1e-5)
    _check_hidden(m, live_hidden, atol=1e-5)


def test_load_dtype_float32_matches_a_float32_checkpoint(tmp_path):
  """`bert_jax.load` computes in the checkpoint's dtype (a bfloat16 run's: bfloat16) unless
  `dtype` says otherwise; with dtype="float32" the bfloat16 run's float32 weights predict
  exactly what the same weights in a float32 checkpoint predict (transformers' numbers)."""
  ref, _ = _reference()
  ck = loader.load_checkpoint(FIXTURE)
  bf16_run = tmp_path / "bf16"  # the fixture's float32 weights, from a run computing in bf16
  cfg = dataclasses.replace(ck.config, dtype="bfloat16")
  hf_io.save_params_dir(bf16_run, cfg, ck.params, tokenizer=ck.tokenizer)
  f32, default = bert_jax.load(FIXTURE), bert_jax.load(bf16_run)
  asked = bert_jax.load(bf16_run, dtype="float32")
  assert (f32.config.dtype, default.config.dtype, asked.config.dtype) == (
    "float32",
    "bfloat16",
    "float32",
  )
  assert {x.dtype for x in jax.tree.leaves(asked.params)} == {np.dtype("float32")}
  texts = list(mk.FILL_MASK_TEXTS)
  assert asked.fill_mask(texts) == f32.fill_mask(texts)  # tokens and probabilities, bit for bit
  _check_fill_mask(_fill_mask_ids(asked), ref["fill_mask"], atol=1e-5)
  # The default is the run's own bfloat16: what dtype="bfloat16" gives, not float32's numbers.
  got = default.fill_mask(texts)
  assert got == bert_jax.load(bf16_run, dtype="bfloat16").fill_mask(texts)
  probs = lambda out: np.array([p for text in out for per_mask in text for _, p in per_mask])
  diff = np.abs(probs(got) - probs(f32.fill_mask(texts))).max()
  assert 1e-6 < diff < 0.05, diff
  with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16"):
    bert_jax.load(bf16_run, dtype="float33")


# --- Continued pretraining from HuggingFace weights --------------------------------------------


def _train_rows(wd):
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["split"] == "train"]


def test_init_from_hf_pretraining_first_loss(nsp_data, tmp_path):
  ref, _ = _reference()
  config = mk.roundtrip_config(data_dir=nsp_data, nsp=True)
  # The trainer's first batch is the one transformers scored.
  batch = mk.first_batch(config, nsp_data)
  want = load_file(str(FIXTURE / "batch.safetensors"))
  assert sorted(batch) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(batch[k], want[k], err_msg=k)
  config.init_from = str(FIXTURE)
  train.train_and_evaluate(config, str(tmp_path / "wd"))
  row = _train_rows(tmp_path / "wd")[0]
  assert row["step"] == 1
  loss = row["mlm_loss"] + row["nsp_loss"]
  hf_loss = mk.hf_reference(FIXTURE)[0]["mlm_nsp_loss"] if LIVE else ref["mlm_nsp_loss"]
  print(f"first-step MLM+NSP loss {loss:.7f}, transformers {hf_loss:.7f}")
  assert abs(loss - hf_loss) <= 1e-5 * hf_loss, (loss, hf_loss)
  # Not a fresh model: BERT's initial loss is ln(4096) + ln(2) = 9.0.
  assert abs(hf_loss - 9.0) > 1.0


def _bert_model_dir(dst) -> pathlib.Path:
  """The fixture as a BertModel checkpoint: no "bert." prefix, no cls.* heads."""
  shutil.copytree(FIXTURE, dst)
  sd = load_file(str(dst / "model.safetensors"))
  bare = {k[len("bert.") :]: v for k, v in sd.items() if k.startswith("bert.")}
  save_file(bare, str(dst / "model.safetensors"), metadata={"format": "pt"})
  cfg = json.loads((dst / "config.json").read_text())
  (dst / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertModel"]}))
  return dst


# --- Every format through one loader ---------------------------------------------------------


def test_every_format_loads_the_same_weights(workdir, tmp_path):
  ref = loader.load_checkpoint(workdir)
  assert ref.format == "workdir" and ref.has_heads and ref.step == 100
  earlier = loader.load_checkpoint(workdir, step=75)  # keep=2: steps 75 and 100
  assert earlier.step == 75 and earlier.tokenizer.fingerprint == ref.tokenizer.fingerprint
  kernel = lambda ck: ck.params["bert"]["encoder"]["layer_0"]["query"]["kernel"]
  assert np.abs(kernel(earlier) - kernel(ref)).max() > 1e-4
  step_dir = workdir / "checkpoints" / "100"
  # Names never decide the format: a workdir called "hf", a HuggingFace dir called "100".
  shutil.copytree(workdir, tmp_path / "hf")
  loader.convert(workdir, tmp_path / "100")
  loader.convert(tmp_path / "100", tmp_path / "params", "bert_jax", scan_layers=True)
  for path, fmt in [
    (step_dir, "orbax"),
    (tmp_path / "hf", "workdir"),
    (tmp_path / "100", "hf"),
    (tmp_path / "params", "bert_jax"),
  ]:
    ck = loader.load_checkpoint(path, scan_layers=False)
    assert ck.format == fmt, path
    assert ck.tokenizer.fingerprint == ref.tokenizer.fingerprint, path
    jax.tree.map(np.testing.assert_array_equal, ck.params, ref.params)
  # The caller's layout, dtype and sharding: a scanned bf16 target on one device.
  cfg = dataclasses.replace(ref.config, scan_layers=True, param_dtype="bfloat16")
  device = jax.devices()[1]
  sharding = jax.sharding.SingleDeviceSharding(device)
  target = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
    model_lib.abstract_params(cfg),
  )
  for path in (workdir, tmp_path / "100"):
    ck = loader.load_checkpoint(path, target=target)
    kernel = ck.params["bert"]["encoder"]["layers"]["layer"]["query"]["kernel"]
    assert kernel.dtype == jax.numpy.bfloat16 and kernel.devices() == {device}
    want = ref.params["bert"]["encoder"]["layer_1"]["query"]["kernel"]
    np.testing.assert_allclose(np.asarray(kernel[1], np.float32), want, rtol=1e-2, atol=1e-3)
  # A BertModel target (fine-tuning) drops the heads.
  body = model_lib.abstract_params(ref.config, pretraining=False)
  body = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), body)
  assert set(loader.load_checkpoint(tmp_path / "100", target=body).params) == {
    "embeddings",
    "encoder",
    "pooler",
  }
  # Workdirs written before the tokenizer metadata was renamed still load.
  old = tmp_path / "old"
  shutil.copytree(workdir, old)
  os.rename(old / "tokenizer" / "bert_jax_tokenizer.json", old / "tokenizer" / "tokenizer.json")
  shutil.rmtree(old / "data")
  assert bert_jax.load(old).tokenizer.fingerprint == ref.tokenizer.fingerprint


def test_fine_tuning_target_gets_the_encoder(workdir):
  """A fine-tuning target ({"bert", "head"}) from a pretraining workdir or HF dir: the encoder
  on the target's device and layout, no head (the caller's fresh head stays)."""
  ref = loader.load_checkpoint(workdir)
  cfg = dataclasses.replace(ref.config, scan_layers=True)
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[2])
  head = {"classifier": {"kernel": np.zeros((cfg.hidden_size, 3)), "bias": np.zeros(3)}}
  target = {"bert": model_lib.abstract_params(cfg, pretraining=False), "head": head}
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), target)
  got = {}
  for path in (workdir, FIXTURE):
    got[path] = loader.load_checkpoint(path, target=target).params
    assert set(got[path]) == {"bert"}, path
    kernel = got[path]["bert"]["encoder"]["layers"]["layer"]["query"]["kernel"]
    assert kernel.devices() == {jax.devices()[2]}
  want = params_tree.stack_layers(ref.params)["bert"]
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got[workdir]["bert"]), want)


def test_sharded_hf_checkpoint(tmp_path):
  """model.safetensors.index.json + shards, as save_pretrained writes big models."""
  d = tmp_path / "sharded"
  shutil.copytree(FIXTURE, d)
  sd = load_file(str(d / "model.safetensors"))
  (d / "model.safetensors").unlink()
  names = sorted(sd)
  shards = {
    "model-00001-of-00002.safetensors": names[::2],
    "model-00002-of-00002.safetensors": names[1::2],
  }
  for shard, keys in shards.items():
    save_file({k: sd[k] for k in keys}, str(d / shard), metadata={"format": "pt"})
  weight_map = {k: shard for shard, keys in shards.items() for k in keys}
  (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  got = loader.load_checkpoint(d)
  assert got.format == "hf"
  jax.tree.map(np.testing.assert_array_equal, got.params, loader.load_checkpoint(FIXTURE).params)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
  """Unigram and BPE SentencePiece models of the bundled corpus (1,000 pieces)."""
  from bert_jax.tokenizers import training as tokenizer_training  # noqa: PLC0415

  d = tmp_path_factory.mktemp("sp")
  return {
    kind: tokenizer_training.train(
      str(mk.CORPUS), "sentencepiece", 1000, str(d / f"{kind}.model"), sp_model_type=kind
    )[0]
    for kind in ("unigram", "bpe")
  }


def test_sentencepiece_export(sentencepiece, tmp_path):
  """A unigram model exports as a `tokenizers` Unigram with the same ids on every corpus line
  (transformers' PreTrainedTokenizerFast loads it); BPE is a one-line error."""
  import tokenizers

  cfg = model_config.BertConfig(
    vocab_size=1000, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64
  )
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda a: (0.5 * rng.standard_normal(a.shape)).astype(np.float32),
    model_lib.abstract_params(cfg),
  )
  uni = sentencepiece["unigram"]
  hf_io.save_hf(tmp_path / "hf", cfg, params, tokenizer=uni)
  assert sorted(os.listdir(tmp_path / "hf")) == sorted(
    ["config.json", "model.safetensors", "spm.model", "special_tokens_map.json"]
    + ["tokenizer.json", "tokenizer_config.json"]
  )
  hf = tokenizers.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
  digest = mk.ids_digest(lambda t: hf.encode(t, add_special_tokens=False).ids)
  assert digest == _digest(uni)
  assert hf.encode("a b").ids[0] == uni.cls_id and hf.encode("a b").ids[-1] == uni.sep_id
  back = bert_jax.load(tmp_path / "hf")
  assert back.tokenizer.fingerprint == uni.fingerprint
  with pytest.raises(ValueError) as e:
    hf_io.save_hf(tmp_path / "bpe", cfg, params, tokenizer=sentencepiece["bpe"])
  _one_line(e, "only a unigram SentencePiece model exports", "BPE", "--tokenizer=false")
  assert not (tmp_path / "bpe").exists()
  if LIVE:
    import transformers

    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert mk.ids_digest(lambda t: auto(t, add_special_tokens=False)["input_ids"]) == digest
    fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), top_k=5)
    text = "the king and [MASK] of hearts ."
    theirs = [[[(p["token"], p["score"]) for p in fill(text)]]]
    ours = [[[(uni.token_to_id(t), p) for t, p in back.fill_mask(text)[0]]]]
    _check_fill_mask(ours, theirs, atol=1e-5)


# --- One-line errors --------------------------------------------------------------------------


def test_one_line_errors(workdir, tmp_path):
  # Not a checkpoint: says what was looked for. A bare config.json is not HuggingFace weights.
  (tmp_path / "empty").mkdir()
  (tmp_path / "cfg_only").mkdir()
  shutil.copy(FIXTURE / "config.json", tmp_path / "cfg_only" / "config.json")
  for d in ("empty", "cfg_only"):
    with pytest.raises(FileNotFoundError) as e:
      bert_jax.load(tmp_path / d)
    _one_line(e, str(tmp_path / d), "not a checkpoint", "checkpoints/<step>", "model.safetensors")
  # A step that does not exist; a step for a format without steps.
  with pytest.raises(FileNotFoundError) as e:
    bert_jax.load(workdir, step=7)
  _one_line(e, "no checkpoint at step 7", "steps: ")
  with pytest.raises(ValueError) as e:
    bert_jax.load(FIXTURE, step=7)
  _one_line(e, "step=7", "hf checkpoint has no steps")
  # init_from another architecture, named before any weights are read.
  cfg = dataclasses.replace(loader.read_config(FIXTURE)[1], num_layers=3, hidden_size=48)
  with pytest.raises(ValueError) as e:
    train.restore_init_from(str(FIXTURE), cfg, model_lib.abstract_params(cfg))
  _one_line(e, "another architecture", "num_layers=2 (checkpoint) vs 3", "hidden_size=32")
  # A tokenizer whose vocabulary size differs from the weights'.
  short = tmp_path / "short"
  shutil.copytree(FIXTURE, short)
  lines = (short / "vocab.txt").read_text().splitlines()
  (short / "vocab.txt").write_text("".join(t + "\n" for t in lines[:-1]))
  with pytest.raises(ValueError) as e:
    bert_jax.load(short)
  _one_line(e, str(short), "tokenizer has 4095 tokens", "vocab_size is 4096")
  # The CLI: one line, exit status 1, nothing written.
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  cmd = [sys.executable, "-m", "bert_jax.convert", f"--src={workdir}", "--step=7"]
  done = subprocess.run(
    [*cmd, f"--dst={tmp_path / 'out'}"], capture_output=True, text=True, env=env, timeout=300
  )
  assert done.returncode == 1
  errors = [ln for ln in done.stderr.splitlines() if ln.startswith("convert:")]
  assert len(errors) == 1 and "no checkpoint at step 7" in errors[0], done.stderr
  assert not (tmp_path / "out").exists()
