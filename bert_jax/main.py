"""Pretraining entry point: flags only.

  python -m bert_jax.main --config=configs/bert_base.py:base --workdir=/tmp/bert \
      --config.data.dir=/data/wiki_books_128
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import cli

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Path to an ml_collections config file[:ARG].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and data.")
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed",
  False,
  "Call jax.distributed.initialize() (multi-host TPU/GPU, or the flags below).",
)
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_CPU_DEVICES = flags.DEFINE_integer(
  "num_cpu_devices", None, "Fake this many CPU devices (testing meshes on one host)."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not flags.FLAGS["verbosity"].present:
    # orbax and grain log every save at INFO; progress goes to stdout.
    logging.set_verbosity(logging.WARNING)
  import jax

  if _CPU_DEVICES.value:
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  if _DISTRIBUTED.value:
    jax.distributed.initialize(
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
    )
  from bert_jax import train

  logging.info(
    "JAX %s: %d processes, %d devices (%s)",
    jax.__version__,
    jax.process_count(),
    jax.device_count(),
    jax.devices()[0].device_kind,
  )
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    if os.environ.get("BERT_JAX_TRACEBACK"):
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  finally:
    if _DISTRIBUTED.value:
      jax.distributed.shutdown()


def _parse_or_exit(argv: list[str]) -> list[str]:
  """Config problems (unknown key, wrong type, bad :ARG, missing file) as one line, before
  anything is created or computed."""
  try:
    rest = flags.FLAGS(cli.resolve_config_args(argv))
    if flags.FLAGS["config"].present:
      _ = _CONFIG.value.model  # config_flags defers load errors to first access
  except (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError) as e:
    text = str(e)
    if "Traceback" in text:  # an exception raised inside get_config(): keep its last line
      text = [ln for ln in text.splitlines() if ln.strip()][-1]
    msg = " ".join(text.replace("\\n", " ").split())
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)
  return rest


def run():
  app.run(main, flags_parser=_parse_or_exit)


if __name__ == "__main__":
  run()
