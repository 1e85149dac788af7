"""input_pipeline: decoding, epochs, per-process sharding, exact resume, global arrays."""

import json
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh

from bert_jax import config_lib
from bert_jax import sharding as sh
from bert_jax.data import input_pipeline as ip
from bert_jax.data import pretraining as cd
from bert_jax.data import records

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = config_lib.BUNDLED_CORPUS


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("ip") / "data")
  cd.build(
    SAMPLE,
    d,
    max_seq_length=64,
    eval_fraction=0.1,
    num_workers=1,
    progress=False,
    records_per_shard=500,
  )
  return d


def _take(ds, n):
  it = iter(ds)
  return [next(it) for _ in range(n)]


def test_batches_decode_and_pad(data):
  meta = ip.read_metadata(data)
  (b,) = _take(
    ip.make_dataset(data, "train", global_batch_size=8, seed=0, process_index=0, process_count=1), 1
  )
  assert b["input_ids"].shape == (8, 64) and b["input_ids"].dtype == np.int32
  assert b["next_sentence_label"].shape == (8,) and b["epoch"].tolist() == [0] * 8
  assert "masked_lm_positions" not in b
  for x, seg, m in zip(b["input_ids"], b["segment_ids"], b["input_mask"], strict=True):
    n = int(m.sum())
    assert np.all(m[:n] == 1) and np.all(x[n:] == 0) and np.all(seg[n:] == 0)
    sep = np.flatnonzero(x == meta["tokenizer"]["sep_id"])
    assert x[0] == meta["tokenizer"]["cls_id"] and sep[-1] == n - 1
    assert np.all(seg[: sep[0] + 1] == 0) and np.all(seg[sep[0] + 1 : n] == 1)


def test_epochs_reshuffle_and_cover(data):
  n = ip.read_metadata(data)["splits"]["train"]["num_sequences"]
  ds = ip.make_dataset(
    data, "train", global_batch_size=10, seed=3, process_index=0, process_count=1
  )
  steps = 2 * n // 10 + 1
  b = _take(ds, steps)
  ids = np.concatenate([x["example_id"] for x in b])
  epochs = np.concatenate([x["epoch"] for x in b])
  np.testing.assert_array_equal(epochs, np.arange(len(ids)) // n)
  e0, e1 = ids[:n], ids[n : 2 * n]
  assert sorted(e0) == sorted(e1) and len(set(e0)) == n
  assert not np.array_equal(e0, e1)
  again = np.concatenate([x["example_id"] for x in _take(ds, 3)])
  np.testing.assert_array_equal(again, ids[:30])  # seeded
  other = ip.make_dataset(
    data, "train", global_batch_size=10, seed=4, process_index=0, process_count=1
  )
  assert not np.array_equal(np.concatenate([x["example_id"] for x in _take(other, 3)]), ids[:30])


def test_processes_are_disjoint_and_cover_the_global_batch(data):
  kw = dict(global_batch_size=8, seed=1)
  whole = _take(ip.make_dataset(data, "train", process_index=0, process_count=1, **kw), 20)
  parts = [
    _take(ip.make_dataset(data, "train", process_index=p, process_count=2, **kw), 20)
    for p in range(2)
  ]
  for step in range(20):
    a, b = (set(parts[p][step]["example_id"].tolist()) for p in range(2))
    assert len(a) == len(b) == 4 and not a & b
    assert a | b == set(whole[step]["example_id"].tolist())
  with pytest.raises(ValueError, match="not a positive multiple of the process count 3"):
    ip.make_dataset(data, "train", global_batch_size=8, seed=0, process_index=0, process_count=3)


def test_exact_resume(data, tmp_path):
  import orbax.checkpoint as ocp

  ds = ip.make_dataset(
    data, "train", global_batch_size=16, seed=5, process_index=0, process_count=1
  )
  it = iter(ds)
  for _ in range(7):
    next(it)
  state = it.get_state()
  mngr = ocp.CheckpointManager(str(tmp_path / "ckpt"), item_names=("ds",))
  mngr.save(7, args=ocp.args.Composite(ds=grain_save(it)))
  mngr.wait_until_finished()
  want = [next(it) for _ in range(3)]
  it2 = iter(ds)
  it2.set_state(state)
  it3 = iter(ds)
  mngr.restore(7, args=ocp.args.Composite(ds=grain_restore(it3)))
  for other in (it2, it3):
    for w in want:
      got = next(other)
      for k in w:
        np.testing.assert_array_equal(got[k], w[k])


def grain_save(it):
  import grain

  return grain.checkpoint.CheckpointSave(it)


def grain_restore(it):
  import grain

  return grain.checkpoint.CheckpointRestore(it)


def test_eval_is_padded_not_dropped(data):
  n = ip.read_metadata(data)["splits"]["eval"]["num_sequences"]
  batches = list(
    ip.make_dataset(
      data,
      "eval",
      global_batch_size=6,
      seed=0,
      shuffle=False,
      repeat=False,
      process_index=0,
      process_count=1,
    )
  )
  assert len(batches) == -(-n // 6)
  ids = np.concatenate([b["example_id"] for b in batches])
  real = ids >= 0
  assert real.sum() == n and len(set(ids[real].tolist())) == n
  pad_mask = np.concatenate([b["input_mask"] for b in batches])[~real]
  assert not pad_mask.any()
  # Two processes: same number of batches, together every example once.
  per = [
    list(
      ip.make_dataset(
        data,
        "eval",
        global_batch_size=6,
        seed=0,
        shuffle=False,
        repeat=False,
        process_index=p,
        process_count=2,
      )
    )
    for p in range(2)
  ]
  assert len(per[0]) == len(per[1]) == len(batches)
  both = np.concatenate([b["example_id"] for p in per for b in p])
  assert sorted(both[both >= 0].tolist()) == sorted(ids[real].tolist())


def test_to_global_on_mesh(data):
  mesh = Mesh(
    np.array(jax.devices()).reshape(2, 2, 2),
    ("data", "fsdp", "tensor"),
    axis_types=(AxisType.Auto,) * 3,
  )
  (b,) = _take(ip.make_dataset(data, "train", global_batch_size=8, seed=0), 1)
  g = sh.to_global(b, mesh)
  assert g["input_ids"].shape == (8, 64) and g["epoch"].shape == (8,)
  assert g["input_ids"].sharding.spec[0] == ("data", "fsdp")
  assert {s.data.shape for s in g["input_ids"].addressable_shards} == {(2, 64)}
  for k in b:
    np.testing.assert_array_equal(np.asarray(g[k]), b[k])


def test_errors(data, tmp_path):
  with pytest.raises(FileNotFoundError, match="metadata.json not found"):
    ip.read_metadata(str(tmp_path))
  (tmp_path / "metadata.json").write_text("{not json")
  with pytest.raises(ValueError, match="is corrupt"):
    ip.read_metadata(str(tmp_path))
  (tmp_path / "metadata.json").write_text('{"format_version": 1}')
  with pytest.raises(ValueError, match="missing max_seq_length"):
    ip.read_metadata(str(tmp_path))
  meta = ip.read_metadata(data)
  ip.check_vocab(meta, 30522)
  with pytest.raises(ValueError, match="vocab mismatch.*30522.*1000"):
    ip.check_vocab(meta, 1000)
  reader = ip.RecordReader(ip.split_files(data, "train", meta), meta)
  with pytest.raises(ValueError, match="inconsistent record"):
    reader.decode(records.HEADER.pack(0, 0, 3, 10, 0) + b"\0" * 4)


def test_corrupt_record_names_the_file(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter

  d = tmp_path / "d"
  cd.build(SAMPLE, str(d), max_seq_length=64, eval_fraction=0, num_workers=1, progress=False)
  shard = d / "train-00000-of-00001.array_record"
  n = ip.read_metadata(str(d))["splits"]["train"]["num_sequences"]
  w = ArrayRecordWriter(str(shard), "group_size:1")
  for i in range(n):
    w.write(records.HEADER.pack(i, 0, 3, 5, 0) + b"\1\0" * (5 if i != 2 else 4))
  w.close()
  reader = ip.RecordReader([str(shard)], ip.read_metadata(str(d)))
  reader.read(1)
  with pytest.raises(ValueError, match=r"train-00000-of-00001.array_record: corrupt record 2"):
    reader.read(2)


def _rewrite_shard(shard, change):
  """Rewrites an ArrayRecord shard with change(index, Record) -> Record applied to each record,
  as a build would have written it (its fingerprint in metadata.json follows)."""
  from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

  from bert_jax.data import records

  reader = ArrayRecordReader(str(shard))
  raw = reader.read_all()
  reader.close()
  w = ArrayRecordWriter(str(shard), records.ARRAY_RECORD_OPTIONS)
  for i, rec in enumerate(raw):
    r = change(i, records.decode(rec, np.dtype("<u2")))
    w.write(records.encode(*r))
  w.close()
  meta_path = shard.parent / "metadata.json"
  meta = json.loads(meta_path.read_text())
  for split in meta["splits"].values():
    if shard.name in split["files"]:
      split["fingerprints"][split["files"].index(shard.name)] = records.shard_fingerprint(
        str(shard)
      )
  meta_path.write_text(json.dumps(meta))


def _with_token(r, position, value, field="tokens"):
  ids = getattr(r, field).copy()
  ids[position] = value
  return r._replace(**{field: ids})


def test_out_of_range_token_ids_name_the_record(tmp_path):
  d = tmp_path / "d"
  cd.build(
    SAMPLE,
    str(d),
    max_seq_length=64,
    eval_fraction=0,
    write_masks=True,
    num_workers=1,
    progress=False,
  )
  meta = ip.read_metadata(str(d))
  assert meta["tokenizer"]["vocab_size"] == 30522 and meta["token_dtype"] == "uint16"
  shard = d / "train-00000-of-00001.array_record"
  bad = {7: ("masked_tokens", 30522), 9: ("masked_ids", 65535)}

  def change(i, r):
    return _with_token(r, 0, bad[i][1], bad[i][0]) if i in bad else r

  _rewrite_shard(shard, change)
  reader = ip.RecordReader([str(shard)], meta)
  assert reader.read(6)["input_ids"].max() < 30522 and reader.read(8)["masked_lm_ids"].max() < 30522
  with pytest.raises(
    ValueError,
    match=r"train-00000-of-00001.array_record: corrupt record 7: token id 30522 outside the "
    r"vocabulary \[0, 30522\)",
  ):
    reader.read(7)
  with pytest.raises(ValueError, match=r"corrupt record 9: label id 65535 outside the vocabulary"):
    reader.read(9)


def test_out_of_range_token_id_stops_training_with_one_line(tmp_path):
  # Every training record carries id 40000 >= the model's 30522: the run must stop at the first
  # batch naming the shard and record, not train on clamped ids or report a NaN loss.
  d = tmp_path / "d"
  cd.build(SAMPLE, str(d), max_seq_length=64, eval_fraction=0.05, num_workers=1, progress=False)
  _rewrite_shard(d / "train-00000-of-00001.array_record", lambda i, r: _with_token(r, 1, 40000))
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.main",
      f"--config={ROOT / 'configs' / 'local.py'}:steps=2",
      f"--workdir={tmp_path / 'wd'}",
      f"--config.data.dir={d}",
      "--config.model.vocab_size=30522",
      "--config.model.hidden_size=32",
      "--config.model.intermediate_size=64",
      "--config.model.num_heads=2",
      "--config.eval.every_steps=0",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert re.fullmatch(
    r"main: error: \S*train-00000-of-00001\.array_record: corrupt record \d+: token id 40000 "
    r"outside the vocabulary \[0, 30522\)",
    last,
  ), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
