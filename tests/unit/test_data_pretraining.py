"""Fault suite, building data: real `python -m bert_jax.create_data` (and trainer) processes on
real files. A full disk is one line and leaves nothing; a signal stops a build with one line
and no traceback, its worker processes gone and nothing left; what a SIGKILLed build left is
removed by the next success; --output_dir is not made for an input without text; the trainer
skips a binary corpus file as create_data does."""

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from unit.test_train import ROOT, _env

CORPUS = str(ROOT / "bert_jax" / "data" / "sample_public_domain.txt")
TMP = ".create_data-"


def _cmd(out, *extra, corpus=CORPUS):
  return [
    sys.executable,
    "-m",
    "bert_jax.create_data",
    f"--input={corpus}",
    f"--output_dir={out}",
    "--noprogress",
    "--max_seq_length=64",
    "--max_predictions_per_seq=10",
    *extra,
  ]


def _run(cmd, **kw):
  return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, **kw)


def _last(stderr):
  return stderr.strip().splitlines()[-1]


def _leftovers(out):
  return sorted(n for n in os.listdir(out) if n.startswith(TMP)) if out.is_dir() else []


def _snapshot(out):
  return {
    os.path.relpath(os.path.join(d, n), out): open(os.path.join(d, n), "rb").read()
    for d, _, names in os.walk(out)
    for n in names
  }


def _file_size_limit(limit):
  """preexec_fn: writes past `limit` bytes fail with EFBIG (the kernel's failed write, as a
  full disk's ENOSPC), SIGXFSZ ignored (an ignored signal stays ignored across exec)."""

  def apply():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

  return apply


@pytest.fixture
def small_disk(tmp_path):
  """(directory, preexec_fn, reasons): a 1 MiB tmpfs when root may mount one; otherwise a
  directory where the build runs under a 1 MiB file-size limit."""
  mnt = tmp_path / "disk"
  mnt.mkdir()
  mounted = (
    os.geteuid() == 0
    and subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    ).returncode
    == 0
  )
  try:
    if mounted:
      yield mnt, None, "No space left on device"
    else:
      yield mnt, _file_size_limit(1 << 20), "File too large"
  finally:
    if mounted:
      subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_is_one_line_and_leaves_nothing(small_disk):
  """37.4: the shards (4 passes of the sample, about 2 MB) do not fit: one line naming the
  output directory, no traceback, no `.create_data-*`; an --output_dir the build made is gone,
  and an old dataset that --overwrite was to replace is as it was."""
  disk, preexec, reason = small_disk
  fresh = disk / "fresh"
  r = _run(_cmd(fresh, "--dupe_factor=4", "--num_workers=1"), preexec_fn=preexec)
  assert r.returncode == 1, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert _last(r.stderr) == (
    f"create_data: error: cannot write the dataset in {fresh}: {reason}; nothing of this build "
    "is left there"
  )
  assert not fresh.exists()

  old = disk / "old"
  r = _run(_cmd(old, "--dupe_factor=1", "--num_workers=1", "--eval_fraction=0"))
  assert r.returncode == 0, r.stderr[-2000:]
  before = _snapshot(old)
  r = _run(_cmd(old, "--dupe_factor=4", "--num_workers=1", "--overwrite"), preexec_fn=preexec)
  assert r.returncode == 1, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert _last(r.stderr) == (
    f"create_data: error: cannot write the dataset in {old}: {reason}; nothing of this build is "
    "left there (the old dataset is as it was)"
  )
  assert _snapshot(old) == before and _leftovers(old) == []


def _children(pid):
  """The pids whose parent is `pid` (from /proc)."""
  out = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat") as f:
          stat = f.read()
      except OSError:
        continue
      if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
        out.append(int(name))
  return out


def _running(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return False
  return stat[stat.rindex(")") + 2] != "Z"


def _start_and_wait_for_workers(out, n_workers=2):
  """A 2-worker build (its own process group, as a shell job) once its workers run."""
  proc = subprocess.Popen(
    _cmd(out, "--dupe_factor=20", f"--num_workers={n_workers}"),
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
  )
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if _leftovers(out) and len(_children(proc.pid)) >= n_workers:
      return proc
    time.sleep(0.02)
  proc.kill()
  raise AssertionError(f"the build ended or stalled before its workers ran: {proc.poll()}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_stops_a_build_in_one_line(tmp_path, sig):
  """37.5: SIGTERM (to the process, as `kill`) or SIGINT (to the process group, as Ctrl-C in
  a shell): exit 128 + signal, one line and no traceback (workers included), the workers
  gone, and no trace of the build on disk."""
  out = tmp_path / "out"
  proc = _start_and_wait_for_workers(out)
  workers = _children(proc.pid)
  if sig == signal.SIGINT:
    os.killpg(proc.pid, sig)
  else:
    proc.send_signal(sig)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 128 + sig, err[-2000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  assert _last(err) == (
    f"create_data: {sig.name} received: stopped; nothing of this build is left in {out}; rerun "
    "the same command to build it"
  )
  assert not out.exists()
  deadline = time.time() + 30
  while any(map(_running, workers)) and time.time() < deadline:
    time.sleep(0.1)
  assert not any(map(_running, workers))


def test_a_killed_builds_leftovers_go_with_the_next_success(tmp_path):
  """37.5: SIGKILL leaves `.create_data-<pid>-*` (the issue's 57 MB); the next successful build
  removes it and an older version's (no pid), never a live process's."""
  out = tmp_path / "out"
  proc = _start_and_wait_for_workers(out)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.communicate(timeout=60)
  killed = _leftovers(out)
  assert len(killed) == 1 and killed[0].startswith(f"{TMP}{proc.pid}-"), killed
  (out / f"{TMP}abc123").mkdir()  # an older version's name
  live = out / f"{TMP}{os.getpid()}-x"  # this test process runs: not a leftover
  live.mkdir()
  r = _run(_cmd(out, "--num_workers=1"))
  assert r.returncode == 0, r.stderr[-2000:]
  assert _leftovers(out) == [live.name]
  assert json.loads((out / "metadata.json").read_text())["splits"]["train"]["num_sequences"] > 0


def test_a_signal_while_the_dataset_is_put_in_place_waits_for_the_end(tmp_path, monkeypatch):
  """The handlers hand their exception to files.interrupt: one that comes while the finished
  dataset replaces the old one takes effect once it is whole, never with half of each."""
  from bert_jax.data import pretraining as pretraining_data
  from bert_jax.runtime import files

  out = tmp_path / "out"
  opts = dict(max_seq_length=64, max_predictions_per_seq=10, num_workers=1, progress=False)
  pretraining_data.build(CORPUS, str(out), dupe_factor=1, **opts)

  class Stop(BaseException):
    pass

  replace, calls = os.replace, []

  def replace_then_signal(src, dst):
    replace(src, dst)
    if not calls and os.path.dirname(dst) == str(out):  # the first file moved into place
      calls.append(dst)
      files.interrupt(Stop())

  monkeypatch.setattr(os, "replace", replace_then_signal)
  with pytest.raises(Stop) as e:
    pretraining_data.build(CORPUS, str(out), dupe_factor=2, overwrite=True, **opts)
  assert e.value.deferred and calls
  meta = json.loads((out / "metadata.json").read_text())
  assert meta["dupe_factor"] == 2
  shards = sorted(f for split in meta["splits"].values() for f in split["files"])
  assert sorted(n for n in os.listdir(out) if n.endswith(".array_record")) == shards
  assert _leftovers(out) == []


def test_output_dir_is_not_made_for_an_input_without_text(tmp_path):
  """37.5: an input that yields nothing (a binary file alone, a glob matching nothing) is one
  line, and --output_dir is not left behind."""
  binary = tmp_path / "bin.dat"
  binary.write_bytes(b"\x00\x01\x02 binary \x00 data\n" * 100)
  out = tmp_path / "out"
  r = _run(_cmd(out, "--num_workers=1", corpus=str(binary)))
  assert r.returncode == 1
  assert _last(r.stderr) == f"create_data: error: --input={binary}: no sequences (no usable text)"
  assert not out.exists()
  r = _run(_cmd(out, "--num_workers=1", corpus=str(tmp_path / "missing*.txt")))
  assert r.returncode == 1 and "no file matches" in _last(r.stderr)
  assert not out.exists()
