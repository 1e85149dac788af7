"""The end-to-end half of tests/unit/test_messages.py (real processes; slow): see its
docstring."""

import json
import re
import shutil

import pytest
from unit import test_messages as unit_messages
from unit.test_messages import _lines, _run

from bert_jax.runtime import checkpoints as ckpt_lib

# The unit half's fixtures, shared here.
finetuned, workdir = unit_messages.finetuned, unit_messages.workdir


@pytest.mark.slow
def test_text_fields_comma_form_and_majority_baseline(finetuned):
  wd, _, r = finetuned
  assert r.returncode == 0, r.stderr[-3000:]
  config = json.loads((wd / "config.json").read_text())
  assert config["task"]["text_fields"] == ["title", "text"]
  results = json.loads((wd / "results.json").read_text())
  base = results["baseline"]
  assert {k: base[k] for k in ("name", "prediction", "dev", "test")} == {
    "name": "majority class",
    "prediction": "pos",
    "dev": {"accuracy": 1.0},
    "test": {"accuracy": 0.75},
  }
  assert base["at_or_below"]["dev"] == [0]
  test_acc = results["seeds"][0]["test"]["accuracy"]
  assert base["at_or_below"]["test"] == ([0] if test_acc <= 0.75 else [])
  dev_line = [ln for ln in r.stdout.splitlines() if ln.startswith("custom dev accuracy:")]
  assert len(dev_line) == 1 and re.fullmatch(
    r"custom dev accuracy: [01]\.\d{4} ± 0\.0000 \(median .*, 1 seed\); majority class "
    r"1\.0000: the seed is at or below it",
    dev_line[0],
  ), r.stdout[-2000:]
  test_line = [ln for ln in r.stdout.splitlines() if ln.startswith("custom test accuracy:")]
  assert len(test_line) == 1 and "; majority class 0.7500" in test_line[0]


@pytest.mark.slow
def test_convert_prints_its_line_only(workdir, tmp_path):
  r = _run("-m", "bert_jax.convert", f"--src={workdir}", f"--dst={tmp_path / 'hf'}")
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout == f"convert: wrote hf checkpoint {tmp_path / 'hf'}\n"
  info = re.compile(r"^I\d{4} ", re.M)  # absl's INFO lines (orbax logs every read at INFO)
  assert not info.search(r.stderr), r.stderr[:2000]
  # --verbosity still shows them.
  r = _run("-m", "bert_jax.convert", f"--src={workdir}", f"--dst={tmp_path / 'hf2'}", "-v=0")
  assert r.returncode == 0 and info.search(r.stderr)


@pytest.mark.parametrize(
  "name, text, message",
  [
    ("config.json", "", "empty file, not JSON"),
    ("config.json", "[]", "holds a JSON array, not an object"),
    ("seed_0/result.json", "[]", "holds a JSON array, not an object"),
    ("seed_0/result.json", "{}", "no dev, test (not the file this run wrote)"),
  ],
)
@pytest.mark.slow
def test_workdir_json_is_one_line_naming_it(finetuned, tmp_path, name, text, message):
  wd, cmd, first = finetuned
  assert first.returncode == 0, first.stderr[-3000:]
  copy = tmp_path / "run"
  shutil.copytree(wd, copy)
  (copy / name).write_text(text)
  r = _run(*[a.replace(str(wd), str(copy)) for a in cmd])
  assert r.returncode == 1, r.stderr[-3000:]
  assert _lines(r.stderr, "finetune") == [f"finetune: error: {copy / name}: {message}"]
  assert "Traceback" not in r.stderr
  assert (copy / name).read_text() == text  # left for the user to look at


@pytest.mark.slow
def test_wrong_tokenizer_in_a_workdir_is_named_not_the_checkpoints(workdir, tmp_path, caplog):
  import bert_jax
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  wd = tmp_path / "wd"
  shutil.copytree(workdir, wd)
  vocab = (wd / "tokenizer" / "vocab.txt").read_text().splitlines()
  vocab[-1], vocab[-2] = vocab[-2], vocab[-1]  # another tokenizer of the same size
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  other = tokenizer_lib.WordPieceTokenizer.from_file(str(tmp_path / "vocab.txt"))
  shutil.rmtree(wd / "tokenizer")
  other.save(str(wd / "tokenizer"))
  want = bert_jax.load(str(workdir)).tokenizer.fingerprint

  with pytest.raises(ckpt_lib.WorkdirError) as e:
    bert_jax.load(str(wd))
  assert str(e.value) == (
    f"{wd}/tokenizer: this tokenizer (fingerprint {other.fingerprint[:12]}) is not the one the "
    f"checkpoints were trained with ({want[:12]}); they are fine: put that tokenizer back"
  )
  assert not [r for r in caplog.records if "does not restore" in r.getMessage()]
  r = _run("-m", "bert_jax.convert", f"--src={wd}", f"--dst={tmp_path / 'hf'}")
  assert r.returncode == 1
  assert _lines(r.stderr, "convert") == [f"convert: error: {e.value}"]
  assert not (tmp_path / "hf").exists()
