"""bert_jax.finetune.workdir: a workdir holds one run (the same config on the same inputs, a
change refused in one line naming it, a moved input no change), its status record and the
lines that summarise its results."""

import json

import pytest

from bert_jax.finetune import workdir as wd_lib


def _config(lr=3e-5, train="/data/train.jsonl", every=100):
  return {"init": "", "opt": {"lr": lr, "epochs": 3}, "task": {"train": train},
          "log": {"every_steps": every}}  # fmt: skip


def _inputs(train_sha="a" * 64, tokenizer="f" * 64, init=None):
  return {
    "task": {"train": {"files": ["/data/train.jsonl"], "sha256": train_sha}, "dev": None,
             "test": None},
    "tokenizer": tokenizer,
    "init": init,
  }  # fmt: skip


def test_a_workdir_holds_one_config_and_records_it(tmp_path):
  d = str(tmp_path)
  wd_lib.check_workdir(d, _config(), _inputs(), "")
  assert json.loads((tmp_path / "config.json").read_text()) == _config()
  assert json.loads((tmp_path / "inputs.json").read_text()) == _inputs()
  wd_lib.check_workdir(d, _config(every=5), _inputs(), "")  # logging may change
  with pytest.raises(ValueError) as e:
    wd_lib.check_workdir(d, _config(lr=1e-4), _inputs(), "")
  assert str(e.value) == (
    f"{d} holds a run of another config (opt.lr 3e-05 -> 0.0001): use another --workdir, or "
    "allow it with --config.resume_allow_changes=FIELD"
  )
  wd_lib.check_workdir(d, _config(lr=1e-4), _inputs(), "opt.lr")
  # The same content at another path is no change; the stored config is not rewritten.
  wd_lib.check_workdir(d, _config(train="/elsewhere/train.jsonl"), _inputs(), "")
  assert json.loads((tmp_path / "config.json").read_text()) == _config()


def test_changed_inputs_are_one_line_naming_each(tmp_path):
  d = str(tmp_path)
  wd_lib.check_workdir(d, _config(), _inputs(), "")
  with pytest.raises(ValueError) as e:
    wd_lib.check_workdir(d, _config(), _inputs(train_sha="b" * 64, tokenizer="e" * 64), "")
  assert str(e.value) == (
    f"{d} holds a run on other inputs, and its seeds would mix both: task.train "
    "/data/train.jsonl (sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb); the tokenizer (fingerprint "
    "ffffffffffff -> eeeeeeeeeeee) (then -> now); restore them, or start afresh with another "
    f"--workdir (or after removing {d})"
  )


def test_an_init_at_another_step_names_the_step_to_restore():
  init = lambda step, sha: {"path": "/pre", "format": "workdir", "step": step,
                            "params_sha256": sha}  # fmt: skip
  stored = _inputs(init=init(800, "1" * 64))
  with pytest.raises(ValueError) as e:
    wd_lib.check_inputs("/wd", stored, _inputs(init=init(1000, "2" * 64)))
  msg = str(e.value)
  assert "config.init /pre (step 800 -> 1000, weights sha256 111111111111 -> 222222222222)" in msg
  assert "restore them (--config.init=/pre/checkpoints/800 if that step is kept), or" in msg
  wd_lib.check_inputs("/wd", stored, _inputs(init=init(800, "1" * 64)))  # unchanged: no error


def test_seed_checkpoints_without_a_config_are_refused(tmp_path):
  (tmp_path / "seed_0" / "checkpoints" / "40").mkdir(parents=True)
  with pytest.raises(ValueError) as e:
    wd_lib.check_workdir(str(tmp_path), _config(), _inputs(), "")
  assert str(e.value) == (
    f"{tmp_path} holds seed checkpoints (seed_0/checkpoints/40) but no config.json to check "
    "them against: remove them or use another --workdir"
  )
  assert not (tmp_path / "config.json").exists() and not (tmp_path / "inputs.json").exists()


def test_status_and_summary_lines(tmp_path):
  wd_lib.write_status(str(tmp_path), "preempted", 2, 5)
  assert json.loads((tmp_path / "run_status.json").read_text()) == {
    "state": "preempted",
    "seeds_done": 2,
    "seeds": 5,
  }
  s = {"mean": 0.8125, "std": 0.0125, "median": 0.8, "min": 0.8, "max": 0.825, "n": 2}
  results = {"task": "rt", "main_metric": "accuracy", "splits": {"test": "absent"},
             "baseline": {"name": "majority class", "dev": {"accuracy": 0.5},
             "at_or_below": {"dev": [1]}}, "dev": {"accuracy": s}, "test": {}}  # fmt: skip
  lines = wd_lib.summary("/wd", results)
  assert lines[0] == "rt test: no test split (config.task.test is empty): dev only"
  assert lines[1:] == [
    "rt dev accuracy: 0.8125 ± 0.0125 (median 0.8000, min 0.8000, max 0.8250, 2 seeds); "
    "majority class 0.5000: seed 1 at or below it"
  ]
  results["splits"]["test"] = "unlabelled"
  assert wd_lib.summary("/wd", results)[0] == (
    "rt test: unlabelled, so no metrics: each seed's predictions at its best dev point are in "
    "/wd/seed_<k>/predictions_test.jsonl"
  )
