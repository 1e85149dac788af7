"""The end-to-end half of tests/unit/test_runtime_checkpoints.py (real processes; slow): see its
docstring."""

import glob
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import pytest
from unit.test_runtime_checkpoints import _truncate_largest
from unit.test_train import _env, _main_cmd, _rows

from bert_jax.runtime import checkpoints as ckpt_lib


def _run(workdir, data_dir, steps, fsize=None):
  cmd = _main_cmd(workdir, data_dir, steps)
  if fsize:  # writes past `fsize` bytes fail with EFBIG (SIGXFSZ ignored), then exec the trainer
    limit = (
      "import os, resource as r, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
      f"r.setrlimit(r.RLIMIT_FSIZE, ({fsize}, r.getrlimit(r.RLIMIT_FSIZE)[1])); "
      "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
    )
    cmd = [cmd[0], "-c", limit, *cmd[1:]]
  return subprocess.run(cmd, env=_env(), capture_output=True, text=True)


def _run_until_killed(workdir, data_dir, steps):
  """Starts a run and SIGKILLs it once its step-4 checkpoint is committed and step 5 logged
  (the same command then resumes, so no config changes between runs); returns that step."""
  proc = subprocess.Popen(
    _main_cmd(workdir, data_dir, steps),
    env=_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  log = workdir / "metrics.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    # orbax renames a save to its step number only once it is committed
    lines = log.read_text().split("\n")[:-1] if log.exists() else []  # whole lines only
    if (workdir / "checkpoints" / "4").is_dir() and any(
      json.loads(ln)["step"] >= 5 for ln in lines
    ):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "run finished before it could be killed"
  proc.kill()
  proc.wait()
  return ckpt_lib.read_meta(str(workdir))[1]


def _error_lines(text):
  # orbax logs its own one-line errors around ours (a failed background write).
  return [ln for ln in text.splitlines() if ln.startswith("main: error:")]


def _steps(workdir, split="train"):
  return [r["step"] for r in _rows(workdir, split)]


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back(tiny_data_dir, tmp_path):
  wd = tmp_path / "wd"
  r = _run(wd, tiny_data_dir, 12)  # checkpoints at 8 and 12 (keep=2)
  assert r.returncode == 0, r.stderr[-2000:]
  first = _rows(wd)
  _truncate_largest(wd / "checkpoints" / "12")
  stale = wd / "checkpoints" / "10.orbax-checkpoint-tmp-1234"  # a save a kill cut short
  stale.mkdir()
  (stale / "junk").write_text("x")

  r = _run(wd, tiny_data_dir, 12)
  assert r.returncode == 0, r.stderr[-2000:]
  warning = [ln for ln in r.stderr.splitlines() if "does not restore" in ln]
  assert len(warning) == 1 and f"{wd}/checkpoints/12 does not restore" in warning[0]
  assert "trying step 8" in warning[0]
  assert "Resumed from" in r.stdout and "at step 8" in r.stdout
  assert (wd / "checkpoints.unreadable" / "12" / "params").is_dir()  # kept for inspection
  assert sorted(os.listdir(wd / "checkpoints")) == ["12", "8"]  # 12 saved anew; stale tmp gone
  assert ckpt_lib.read_meta(str(wd))[1] == 12
  # Steps 9-12 replayed from step 8 exactly as the first run trained them.
  strip = lambda rows: [r for r in rows if r["split"] != "perf"]
  assert strip(_rows(wd)) == strip(first) and _steps(wd) == list(range(1, 13))


@pytest.mark.slow
def test_no_checkpoint_restores_is_one_line(tiny_data_dir, tmp_path):
  wd = tmp_path / "wd"
  assert _run(wd, tiny_data_dir, 8).returncode == 0
  for step in ("4", "8"):
    _truncate_largest(wd / "checkpoints" / step)
  before = {p: (wd / p).read_bytes() for p in ("metrics.jsonl", "config.json")}
  sizes = _file_sizes(wd / "checkpoints")
  r = _run(wd, tiny_data_dir, 8)
  assert r.returncode == 1, r.stderr[-2000:]
  assert _error_lines(r.stderr) == [
    f"main: error: no checkpoint in {wd}/checkpoints restores (steps 8, 4; see the warnings "
    "above): move the directory away to train from scratch"
  ]
  # Each step is named once, with what comes next. Other lines (a warning a loaded machine
  # prints, say) are not this test's business; the TensorStore tracebacks the failed restores
  # leave at exit are dropped by checkpoints' hooks (test_storage_leftovers_are_dropped).
  warned = [ln for ln in r.stderr.splitlines() if "does not restore" in ln]
  assert len(warned) == 2, warned
  assert f"{wd}/checkpoints/8 does not restore" in warned[0] and "trying step 4" in warned[0]
  assert f"{wd}/checkpoints/4 does not restore" in warned[1]
  assert "no older checkpoint" in warned[1]
  # Nothing moved, deleted or written: the checkpoints, the log and the config are as they were.
  assert sorted(os.listdir(wd / "checkpoints")) == ["4", "8"]
  assert _file_sizes(wd / "checkpoints") == sizes
  assert not (wd / "checkpoints.unreadable").exists()
  assert {p: (wd / p).read_bytes() for p in before} == before


def _file_sizes(directory):
  return {
    os.path.relpath(f, directory): os.path.getsize(f)
    for f in glob.glob(os.path.join(directory, "**", "*"), recursive=True)
    if os.path.isfile(f)
  }


@pytest.mark.slow
def test_torn_metrics_tail_is_repaired(tiny_data_dir, tmp_path):
  wd, steps = tmp_path / "wd", 24
  resume_step = _run_until_killed(wd, tiny_data_dir, steps)
  with open(wd / "metrics.jsonl", "a") as f:
    f.write('{"step": 9, "split": "train", "mlm_lo')  # killed mid-append

  r = _run(wd, tiny_data_dir, steps)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"{wd}/metrics.jsonl: removed a torn last line" in r.stderr
  assert f"at step {resume_step}" in r.stdout
  with open(wd / "metrics.jsonl") as f:
    rows = [json.loads(ln) for ln in f]  # every line parses
  assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, steps + 1))
  assert [r["step"] for r in rows if r["split"] == "eval"] == [steps]


@pytest.mark.slow
def test_disk_full_during_save_is_one_line_and_resumable(tiny_data_dir, tmp_path):
  wd, steps = tmp_path / "wd", 24
  resume_step = _run_until_killed(wd, tiny_data_dir, steps)
  committed = sorted(os.listdir(wd / "checkpoints"))
  # A checkpoint's arrays are MBs at vocab 30522; metrics, config and the compile cache fit.
  r = _run(wd, tiny_data_dir, steps, fsize=1_000_000)
  assert r.returncode == 1
  assert f"at step {resume_step}" in r.stdout
  assert _error_lines(r.stderr) == [
    f"main: error: cannot write a checkpoint in {wd}/checkpoints: File too large (errno 27)"
  ]
  assert sorted(os.listdir(wd / "checkpoints")) == committed  # no partial save left behind
  assert not list(wd.glob("*.tmp"))

  r = _run(wd, tiny_data_dir, steps)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"at step {resume_step}" in r.stdout
  assert ckpt_lib.read_meta(str(wd))[1] == steps
  assert _steps(wd) == list(range(1, steps + 1))


# ----------------------------------------------------------------------------- in-process


def _unprivileged():
  """The command prefix that runs a command as `nobody` where we are root (root writes past
  any permission), [] where we are not, None where it cannot be done."""
  if os.geteuid() != 0:
    return []
  if not shutil.which("setpriv"):
    return None
  return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.slow
def test_a_workdir_made_unwritable_mid_run_names_the_write_that_failed(tiny_data_dir):
  """37.5: the workdir loses its write permission mid-run. The run used to end on the lock it
  could not remove; it ends on the write that failed, one line, and what it wrote is whole."""
  prefix = _unprivileged()
  if prefix is None:
    pytest.skip("root without setpriv: nothing here can lose its write permission")
  base = tempfile.mkdtemp(prefix="bert_jax_unwritable_")  # reachable by `nobody`
  try:
    os.chmod(base, 0o777)
    data = shutil.copytree(tiny_data_dir, os.path.join(base, "data"))
    subprocess.run(["chmod", "-R", "a+rX", data], check=True)
    wd = pathlib.Path(base, "wd")
    env = _env(HOME=base, JAX_COMPILATION_CACHE_DIR=os.path.join(base, "cache"))
    cmd = [*prefix, *_main_cmd(wd, data, 500, ["--config.ckpt.every_steps=1000"])]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
      if (wd / "metrics.jsonl").exists() and len(_rows(wd)) >= 3:
        break
      time.sleep(0.05)
    assert proc.poll() is None, "the run ended before its workdir could be made unwritable"
    subprocess.run(["chmod", "-R", "a-w", str(wd)], check=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    assert _error_lines(err.decode()) == [
      f"main: error: cannot write {wd}/metrics.jsonl: Permission denied"
    ]
    assert len(_rows(wd)) >= 3  # every row it wrote is whole
  finally:
    subprocess.run(["chmod", "-R", "u+w", base], check=False)
    shutil.rmtree(base, ignore_errors=True)
