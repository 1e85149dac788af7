"""bert_jax.benchmark.protocol: the line protocol between the benchmark and its workers (the
result line read back, the lockstep loop, errors in one line, the worker's environment)."""

import io
import json
import sys

import pytest

from bert_jax.benchmark import protocol


def test_run_once_reads_the_last_result_line_and_reports_a_failure_in_one_line():
  code = (
    "from bert_jax.benchmark import protocol; print('noise'); "
    "protocol.print_result({'a': 1}); protocol.print_result({'a': 2, 'b': [1.5]})"
  )
  assert protocol.run_once([sys.executable, "-c", code], timeout=120) == {"a": 2, "b": [1.5]}
  bad = "import sys; print('BENCH_RESULTS {}'); sys.exit('boom: out of memory')"
  with pytest.raises(RuntimeError) as e:
    protocol.run_once([sys.executable, "-c", bad], timeout=120)
  assert str(e.value) == (
    f"benchmark worker ['-c', {bad!r}] failed (exit 1): ['boom: out of memory']"
  )


def test_print_record_writes_whole_marked_lines(capsys):
  protocol.print_record({"kind": "peak", "tflops": 1.25})
  protocol.print_result({"done": True})
  out = capsys.readouterr().out.splitlines()
  assert out == ['BENCH_RECORD {"kind": "peak", "tflops": 1.25}', 'BENCH_RESULT {"done": true}']
  assert json.loads(out[0][len(protocol.RECORD_MARK) :]) == {"kind": "peak", "tflops": 1.25}


def test_serve_steps_per_line_and_keeps_only_the_measured_ones(monkeypatch, capsys):
  monkeypatch.setattr(sys, "stdin", io.StringIO("settle\nstep\n step \nstop\nstep\n"))
  seconds = iter([0.5, 0.25, 0.125, 9.0])
  assert protocol.serve(lambda: next(seconds)) == [0.25, 0.125]  # the settle step is not kept
  assert capsys.readouterr().out.splitlines() == [
    "BENCH_READY",
    "BENCH_STEP 0.5",
    "BENCH_STEP 0.25",
    "BENCH_STEP 0.125",
  ]  # and nothing after "stop": the last "step" line is never run
  assert next(seconds) == 9.0


def test_error_text_is_one_short_line():
  assert protocol.error_text(ValueError("bad\n  value\tx")) == "ValueError: bad value x"
  long = protocol.error_text(RuntimeError("RESOURCE_EXHAUSTED " + "y " * 400))
  assert long.startswith("RuntimeError: RESOURCE_EXHAUSTED y y") and long.endswith("...")
  assert len(long) == len("RuntimeError: ") + 300 + 3 and "\n" not in long


def test_worker_env_defaults_to_the_cpu_and_takes_extras_on_top(monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
  env = protocol.worker_env({"XLA_FLAGS": "--x", "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert env["JAX_PLATFORMS"] == "cpu" and env["XLA_FLAGS"] == "--x"
  assert env["TF_CPP_MIN_LOG_LEVEL"] == "3"  # an extra wins over this process's value
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  assert protocol.worker_env()["JAX_PLATFORMS"] == "cuda"  # a set platform is kept
  assert protocol.worker_env()["TF_CPP_MIN_LOG_LEVEL"] == "0"
