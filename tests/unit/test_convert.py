"""bert_jax.interop.hf_names, hf_io, loader and the convert CLI: parity with HuggingFace BERT
(golden
fixtures, or live when torch is there), export that from_pretrained loads cleanly, the bert_jax
params dir, and clear bad-input errors.

Fixtures in tests/fixtures/hf/ come from tests/fixtures/make_hf_fixtures.py (transformers 4.57.6).
"""

import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_jax import model as model_lib
from bert_jax import model_config
from bert_jax.interop import hf_io, hf_names, loader
from bert_jax.model import BertForPreTraining
from bert_jax.model_config import BertConfig

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ["l2_h32_a4", "l3_h24_a3", "l1_h16_a2_causal"]
OUTPUTS = ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits")
REPO = pathlib.Path(__file__).resolve().parents[2]


@functools.cache
def _forward(cfg: BertConfig):
  model = BertForPreTraining(cfg)
  return jax.jit(lambda p, ids, seg, mask: model.apply({"params": p}, ids, seg, mask))


def _max_diffs(cfg, params, io):
  out = _forward(cfg)(params, io["input_ids"], io["segment_ids"], io["input_mask"])
  return {k: float(np.abs(np.asarray(out[k]) - io[k]).max()) for k in OUTPUTS}


def _copy_fixture(name, tmp_path) -> pathlib.Path:
  d = tmp_path / name
  shutil.copytree(FIXTURES / name, d)
  (d / "io.safetensors").unlink()
  return d


def _random_params(cfg, seed=0):
  rng = np.random.default_rng(seed)

  def draw(path, x):
    base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
    return (base + 0.1 * rng.standard_normal(x.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, model_lib.abstract_params(cfg))


def _one_line(excinfo, *needles):
  msg = str(excinfo.value)
  assert "\n" not in msg, msg
  for needle in needles:
    assert needle in msg, (needle, msg)


# --- HF -> ours (import) -----------------------------------------------------------------------


@pytest.mark.parametrize(
  "name,scan", [(n, False) for n in NAMES] + [("l3_h24_a3", True)], ids=lambda x: str(x)
)
def test_import_matches_hf_outputs(name, scan):
  cfg, params = hf_io.load_hf(FIXTURES / name, scan_layers=scan)
  assert cfg.scan_layers == scan and cfg.causal == name.endswith("causal")
  io = load_file(str(FIXTURES / name / "io.safetensors"))
  diffs = _max_diffs(cfg, params, io)
  assert max(diffs.values()) < 1e-5, diffs
  # The fixtures are not trivial: outputs vary, padding is present.
  assert io["input_mask"].min() == 0 and np.std(io["mlm_logits"]) > 0.1


def test_import_bert_model_without_prefix(tmp_path):
  """BertModel weights (no "bert." prefix, no heads) give the BertModel params tree."""
  d = _copy_fixture("l2_h32_a4", tmp_path)
  sd = load_file(str(d / "model.safetensors"))
  bare = {k[len("bert.") :]: v for k, v in sd.items() if k.startswith("bert.")}
  save_file(bare, str(d / "model.safetensors"), metadata={"format": "pt"})
  _, ref = hf_io.load_hf(FIXTURES / "l2_h32_a4")
  cfg, params = hf_io.load_hf(d)
  assert set(params) == {"embeddings", "encoder", "pooler"}
  jax.tree.map(np.testing.assert_array_equal, params, ref["bert"])
  # Asking for the pre-training heads names the first missing one.
  with pytest.raises(ValueError) as e:
    hf_names.hf_state_dict_to_params(bare, cfg, pretraining=True, source="x.safetensors")
  _one_line(e, "x.safetensors", "cls.predictions.transform.dense.weight")
  # And heads in the file can be dropped on request.
  model_only = hf_names.hf_state_dict_to_params(sd, cfg, pretraining=False)
  jax.tree.map(np.testing.assert_array_equal, model_only, ref["bert"])


def test_import_legacy_names_and_tied_decoder():
  """Old gamma/beta LayerNorm names, position_ids buffers and the tied decoder are accepted."""
  sd = load_file(str(FIXTURES / "l2_h32_a4" / "model.safetensors"))
  cfg, ref = hf_io.load_hf(FIXTURES / "l2_h32_a4")
  legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma"): v for k, v in sd.items()}
  legacy = {k.replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in legacy.items()}
  legacy["bert.embeddings.position_ids"] = np.arange(16)[None]
  legacy["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]
  legacy["cls.predictions.decoder.bias"] = legacy.pop("cls.predictions.bias")
  params = hf_names.hf_state_dict_to_params(legacy, cfg)
  jax.tree.map(np.testing.assert_array_equal, params, ref)


def test_tf_variable_names_map_onto_hf():
  """Google's TF checkpoint names (read without TF here) map onto the same tensors."""
  sd = load_file(str(FIXTURES / "l2_h32_a4" / "model.safetensors"))
  tf_vars = {"global_step": np.int64(7)}
  for key, value in sd.items():
    name = key.replace(".", "/").replace("LayerNorm/weight", "LayerNorm/gamma")
    name = name.replace("LayerNorm/bias", "LayerNorm/beta")
    name = re.sub(r"encoder/layer/(\d+)/", r"encoder/layer_\1/", name)
    if name.endswith("_embeddings/weight"):
      name = name[: -len("/weight")]
    elif name == "cls/predictions/bias":
      name = "cls/predictions/output_bias"
    elif name.startswith("cls/seq_relationship/"):
      name = name.replace("/weight", "/output_weights").replace("/bias", "/output_bias")
    elif name.endswith("/weight") and "LayerNorm" not in name:
      name, value = name[: -len("/weight")] + "/kernel", value.T
    tf_vars[name] = value
    tf_vars[name + "/adam_m"] = np.zeros_like(value)
  assert "bert/encoder/layer_1/attention/self/query/kernel" in tf_vars
  got = hf_names.tf_variables_to_hf_state_dict(tf_vars)
  assert sorted(got) == sorted(sd)
  for key in sd:
    np.testing.assert_array_equal(got[key], sd[key], err_msg=key)


def test_tf_checkpoint_needs_tensorflow(tmp_path):
  try:
    import tensorflow  # noqa: F401

    pytest.skip("tensorflow is installed")
  except ImportError:
    pass
  shutil.copy(FIXTURES / "l2_h32_a4" / "config.json", tmp_path / "bert_config.json")
  (tmp_path / "bert_model.ckpt.index").write_bytes(b"")
  assert loader.detect_format(tmp_path) == "tf"
  with pytest.raises(ImportError) as e:
    loader.load(tmp_path)
  _one_line(e, "bert_model.ckpt", "tensorflow", "bert_jax[tf]")


# --- ours -> HF (export) -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_export_reproduces_hf_checkpoint(name, tmp_path):
  """Exported tensors == what save_pretrained wrote, bit for bit, from either layout."""
  want = load_file(str(FIXTURES / name / "model.safetensors"))
  hf_cfg = json.loads((FIXTURES / name / "config.json").read_text())
  for scan in (False, True):
    cfg, params = hf_io.load_hf(FIXTURES / name, scan_layers=scan)
    out = tmp_path / f"out_{scan}"
    hf_io.save_hf(out, cfg, params)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(want)  # no tied decoder.weight / decoder.bias, like HF
    for key in want:
      assert got[key].dtype == np.float32
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    ours = json.loads((out / "config.json").read_text())
    for key, value in hf_cfg.items():
      if key != "transformers_version":
        assert ours[key] == value, key
    # Round trip: re-import gives the same config and params.
    cfg2, params2 = hf_io.load_hf(out, scan_layers=scan)
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)
  from safetensors import safe_open

  with safe_open(str(out / "model.safetensors"), "np") as f:
    assert f.metadata() == {"format": "pt"}  # from_pretrained rejects other formats


def test_export_bert_model_tree(tmp_path):
  _, params = hf_io.load_hf(FIXTURES / "l3_h24_a3")
  cfg = hf_names.config_from_hf(json.loads((FIXTURES / "l3_h24_a3" / "config.json").read_text()))
  hf_io.save_hf(tmp_path / "m", cfg, params["bert"])
  got = load_file(str(tmp_path / "m" / "model.safetensors"))
  assert "embeddings.word_embeddings.weight" in got and not any(k.startswith("cls") for k in got)
  assert json.loads((tmp_path / "m" / "config.json").read_text())["architectures"] == ["BertModel"]


def test_config_round_trip():
  cfg = BertConfig(vocab_size=1000, hidden_size=48, num_layers=3, num_heads=6, causal=True)
  hf = hf_names.config_to_hf(cfg)
  assert hf["num_hidden_layers"] == 3 and hf["is_decoder"] is True
  assert hf_names.config_from_hf(hf) == cfg
  assert hf_names.config_from_hf(hf, scan_layers=True).scan_layers
  base = hf_names.config_from_hf(
    dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12)
  )
  assert base == model_config.config_for_size("base")


# --- bert_jax params dir + CLI -----------------------------------------------------------------


def test_params_dir_round_trip(tmp_path):
  cfg, params = hf_io.load_hf(FIXTURES / "l2_h32_a4")
  hf_io.save_params_dir(tmp_path / "p", cfg, params)
  fields = json.loads((tmp_path / "p" / "bert_config.json").read_text())
  assert fields == dataclasses.asdict(cfg)
  flat = load_file(str(tmp_path / "p" / "params.safetensors"))
  assert flat["bert/encoder/layer_1/query/kernel"].shape == (32, 4, 8)
  cfg2, params2 = hf_io.load_params_dir(tmp_path / "p")
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  # Choose the layout on load; bf16 params keep their dtype.
  cfg3, stacked = hf_io.load_params_dir(tmp_path / "p", scan_layers=True)
  assert cfg3.scan_layers
  assert stacked["bert"]["encoder"]["layers"]["layer"]["query"]["kernel"].shape == (2, 32, 4, 8)
  bf16 = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16)), stacked)
  cfg_bf16 = dataclasses.replace(cfg3, param_dtype="bfloat16")
  hf_io.save_params_dir(tmp_path / "b", cfg_bf16, bf16)
  cfg4, params4 = hf_io.load_params_dir(tmp_path / "b")
  assert cfg4 == cfg_bf16 and params4["predictions"]["bias"].dtype == jnp.bfloat16


def test_convert_hf_to_params_dir_and_back(tmp_path):
  assert loader.convert(FIXTURES / "l1_h16_a2_causal", tmp_path / "p", scan_layers=True) == (
    "bert_jax"
  )
  cfg, params = hf_io.load_params_dir(tmp_path / "p")
  assert cfg.scan_layers and cfg.causal
  assert loader.convert(tmp_path / "p", tmp_path / "hf") == "hf"
  want = load_file(str(FIXTURES / "l1_h16_a2_causal" / "model.safetensors"))
  got = load_file(str(tmp_path / "hf" / "model.safetensors"))
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def _cli(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "bert_jax.convert", *args],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env,
    timeout=120,
  )


def test_cli(tmp_path):
  ok = _cli(f"--src={FIXTURES / 'l2_h32_a4'}", f"--dst={tmp_path / 'p'}")
  assert ok.returncode == 0, ok.stderr
  assert (tmp_path / "p" / "params.safetensors").is_file()
  bad = _copy_fixture("l2_h32_a4", tmp_path)
  (bad / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 5}))
  fail = _cli(f"--src={bad}", f"--dst={tmp_path / 'out'}")
  assert fail.returncode == 1
  lines = [ln for ln in fail.stderr.splitlines() if ln.startswith("convert:")]
  assert lines == [f"convert: error: {bad / 'config.json'}: model_type 'gpt2' is not 'bert'"]
  assert not (tmp_path / "out").exists()


# --- bad input ---------------------------------------------------------------------------------


def test_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    hf_io.load_hf(tmp_path / "nope")
  _one_line(e, "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError) as e:
    hf_io.load_hf(tmp_path / "empty")
  _one_line(e, "config.json")
  d = _copy_fixture("l2_h32_a4", tmp_path)
  (d / "model.safetensors").unlink()
  with pytest.raises(FileNotFoundError) as e:
    hf_io.load_hf(d)
  _one_line(e, str(d), "model.safetensors")
  with pytest.raises(FileNotFoundError) as e:
    loader.load(tmp_path / "empty")
  _one_line(e, "not a checkpoint")


def test_bad_config(tmp_path):
  d = _copy_fixture("l2_h32_a4", tmp_path)
  good = json.loads((d / "config.json").read_text())
  for change, needle in [
    ({"model_type": "gpt2"}, "model_type 'gpt2'"),
    ({"hidden_act": "relu"}, "hidden_act='relu'"),
    ({"num_attention_heads": 5}, "not divisible"),
  ]:
    (d / "config.json").write_text(json.dumps({**good, **change}))
    with pytest.raises(ValueError) as e:
      hf_io.load_hf(d)
    _one_line(e, str(d / "config.json"), needle)
  (d / "config.json").write_text("{not json")
  with pytest.raises(ValueError) as e:
    hf_io.load_hf(d)
  _one_line(e, "config.json", "not valid JSON")


def test_shape_mismatch_names_file_and_tensor(tmp_path):
  """A 30,522-vocab checkpoint into a 1,000-vocab config."""
  d = _copy_fixture("l1_h16_a2_causal", tmp_path)
  sd = load_file(str(d / "model.safetensors"))
  sd["bert.embeddings.word_embeddings.weight"] = np.zeros((30522, 16), np.float32)
  save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
  hf = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**hf, "vocab_size": 1000}))
  with pytest.raises(ValueError) as e:
    hf_io.load_hf(d)
  _one_line(
    e,
    str(d / "model.safetensors"),
    "'bert.embeddings.word_embeddings.weight'",
    "(30522, 16)",
    "(1000, 16)",
  )


def test_missing_and_unexpected_tensors(tmp_path):
  d = _copy_fixture("l2_h32_a4", tmp_path)
  sd = load_file(str(d / "model.safetensors"))
  path = str(d / "model.safetensors")
  missing = {k: v for k, v in sd.items() if k != "bert.encoder.layer.1.output.dense.bias"}
  save_file(missing, path, metadata={"format": "pt"})
  with pytest.raises(ValueError) as e:
    hf_io.load_hf(d)
  _one_line(e, path, "missing tensor 'bert.encoder.layer.1.output.dense.bias'")
  save_file({**sd, "classifier.weight": np.zeros((2, 32), np.float32)}, path)
  with pytest.raises(ValueError) as e:
    hf_io.load_hf(d)
  _one_line(e, path, "unexpected tensor 'classifier.weight'")


def test_corrupt_safetensors(tmp_path):
  d = _copy_fixture("l2_h32_a4", tmp_path)
  path = d / "model.safetensors"
  data = path.read_bytes()
  for broken in (b"\x00garbage" * 10, data[: len(data) // 2]):
    path.write_bytes(broken)
    with pytest.raises(ValueError) as e:
      hf_io.load_hf(d)
    _one_line(e, str(path), "cannot read safetensors")


def test_torch_bin_needs_torch(tmp_path):
  try:
    import torch  # noqa: F401

    pytest.skip("torch is installed")
  except ImportError:
    pass
  d = _copy_fixture("l2_h32_a4", tmp_path)
  (d / "model.safetensors").unlink()
  (d / "pytorch_model.bin").write_bytes(b"PK not really")
  with pytest.raises(ImportError) as e:
    hf_io.load_hf(d)
  _one_line(e, str(d / "pytorch_model.bin"), "needs torch")


def test_failed_export_writes_nothing(tmp_path, monkeypatch):
  cfg, params = hf_io.load_hf(FIXTURES / "l2_h32_a4")
  dst = tmp_path / "out" / "hf"
  # Params that do not fit the config: rejected before anything is written.
  wrong = dataclasses.replace(cfg, vocab_size=1000)
  with pytest.raises(ValueError) as e:
    hf_io.save_hf(dst, wrong, params)
  _one_line(e, "word_embeddings", "(100, 32)", "(1000, 32)")
  assert not dst.exists()
  # A failure half-way through writing leaves neither dst nor temp files behind.
  import safetensors.numpy

  def boom(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(safetensors.numpy, "save_file", boom)
  for save in (hf_io.save_hf, hf_io.save_params_dir):
    with pytest.raises(OSError):
      save(dst, cfg, params)
    assert not dst.exists()
    assert list(dst.parent.iterdir()) == []
  monkeypatch.undo()
  # An existing dst is never clobbered unless asked.
  dst.mkdir()
  (dst / "keep").write_text("x")
  with pytest.raises(FileExistsError) as e:
    hf_io.save_hf(dst, cfg, params)
  _one_line(e, str(dst), "already exists")
  assert os.listdir(dst) == ["keep"]
  hf_io.save_hf(dst, cfg, params, overwrite=True)
  assert sorted(os.listdir(dst)) == ["config.json", "model.safetensors"]
  assert sorted(os.listdir(dst.parent)) == ["hf"]


def test_load_params_dir_errors(tmp_path):
  cfg, params = hf_io.load_hf(FIXTURES / "l2_h32_a4")
  hf_io.save_params_dir(tmp_path / "p", cfg, params)
  fields = json.loads((tmp_path / "p" / "bert_config.json").read_text())
  # Fields of other versions' BertConfig are ignored: the weights decide the architecture.
  (tmp_path / "p" / "bert_config.json").write_text(json.dumps({**fields, "fuse_old": True}))
  assert hf_io.load_params_dir(tmp_path / "p")[0] == cfg
  (tmp_path / "p" / "bert_config.json").write_text(json.dumps({**fields, "num_layers": 3}))
  with pytest.raises(ValueError) as e:
    hf_io.load_params_dir(tmp_path / "p")
  _one_line(e, "params.safetensors", "missing parameter 'bert/encoder/layer_2/")


# --- live parity with transformers (only where torch + transformers are installed) -------------

LIVE_CONFIGS = [  # (BertConfig fields, causal)
  (dict(vocab_size=120, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=48), False),
  (dict(vocab_size=333, hidden_size=24, num_layers=1, num_heads=6, intermediate_size=72), True),
]


def _hf_outputs(hf_model, ids, seg, mask):
  import torch

  t = lambda x: torch.from_numpy(np.asarray(x)).long()
  with torch.no_grad():
    out = hf_model(
      input_ids=t(ids), token_type_ids=t(seg), attention_mask=t(mask), output_hidden_states=True
    )
    seq = out.hidden_states[-1]
    return {
      "sequence_output": seq.numpy(),
      "pooled_output": hf_model.bert.pooler(seq).numpy(),
      "mlm_logits": out.prediction_logits.numpy(),
      "nsp_logits": out.seq_relationship_logits.numpy(),
    }


def _inputs(cfg, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.array([11, 7, 3])
  ids = rng.integers(1, cfg.vocab_size, (3, 11)).astype(np.int32)
  mask = (np.arange(11)[None] < lengths[:, None]).astype(np.int32)
  seg = ((np.arange(11)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
  return ids * mask, seg, mask


@pytest.mark.parametrize("fields,causal", LIVE_CONFIGS)
def test_live_export_loads_in_transformers(fields, causal, tmp_path):
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  cfg = BertConfig(max_position_embeddings=16, causal=causal, **fields)
  params = _random_params(cfg)
  hf_io.save_hf(tmp_path / "hf", cfg, params)
  hf_model, info = transformers.BertForPreTraining.from_pretrained(
    tmp_path / "hf", output_loading_info=True, attn_implementation="eager"
  )
  assert info == {
    "missing_keys": [],
    "unexpected_keys": [],
    "mismatched_keys": [],
    "error_msgs": [],
  }
  ids, seg, mask = _inputs(cfg)
  want = _hf_outputs(hf_model.eval(), ids, seg, mask)
  diffs = _max_diffs(
    cfg, params, {"input_ids": ids, "segment_ids": seg, "input_mask": mask, **want}
  )
  assert max(diffs.values()) < 1e-5, diffs


@pytest.mark.parametrize("safetensors_format", [True, False], ids=["safetensors", "bin"])
def test_live_import_from_transformers(safetensors_format, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf_cfg = transformers.BertConfig(
    vocab_size=200,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=40,
    max_position_embeddings=16,
    type_vocab_size=3,
    attn_implementation="eager",
  )
  hf_model = transformers.BertForPreTraining(hf_cfg).eval()
  g = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for _, p in hf_model.named_parameters():
      p.copy_(0.2 * torch.randn(p.shape, generator=g))
  hf_model.save_pretrained(tmp_path / "hf", safe_serialization=safetensors_format)
  cfg, params = hf_io.load_hf(tmp_path / "hf")
  ids, seg, mask = _inputs(cfg)
  seg = seg * 2  # the third token type
  want = _hf_outputs(hf_model, ids, seg, mask)
  diffs = _max_diffs(
    cfg, params, {"input_ids": ids, "segment_ids": seg, "input_mask": mask, **want}
  )
  assert max(diffs.values()) < 1e-5, diffs
