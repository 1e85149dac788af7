r"""Pretraining entry point: flags only (console script `bert_jax_train`).

  bert_jax_train --config=local --workdir=/tmp/bert_local    # the bundled corpus (about 2 min)
  bert_jax_train --config=bert_base --workdir=/tmp/bert --config.data.dir=/data/wiki_books_128

--config takes a bundled config's name (local, bert_base, bert_large), from any directory, or a
config file's path (configs/bert_base.py in a checkout), each with an optional :ARG
(`bert_base:phase=2`, `local:steps=12000`); --config.a.b=value overrides any field. Every
field's allowed values and ranges are checked before anything is written (config_schema).

Exit status: 0 when the run reached its last step; 75 (`preemption.EXIT_PREEMPTED`) when
SIGTERM, SIGINT or SIGHUP stopped it (after saving a checkpoint once training had started;
rerun the same command to resume); 1 for an error a user can fix (one line on stderr), 2 for a
bad flag or config. A config with `log.fill_mask` texts ends by loading the final checkpoint
as a notebook would (`bert_jax.load`) and printing the top predictions for each [MASK].
"""

import sys

from absl import flags, logging
from ml_collections import config_flags

from bert_jax import cli, config_schema
from bert_jax.runtime import preemption

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "A config: a bundled name (local, bert_base, bert_large) or a path, each with [:ARG].",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Directory for checkpoints and logs: a local path or gs://bucket/path."
)
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


def main(argv: list[str]) -> None:
  del argv
  # Several processes stop together: a signal before training waits for their agreement.
  preemption.install(defer=_DISTRIBUTED.value)
  import jax

  from bert_jax.runtime import files

  # A workdir this code cannot serve (s4://, gs:// without gcsfs, a file) fails before the pod
  # joins up.
  files.as_dir(_WORKDIR.value, "--workdir")
  if _CPU_DEVICES.value:
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  from bert_jax import train
  from bert_jax.runtime import multihost

  if _DISTRIBUTED.value:
    multihost.initialize(
      "main",
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
    )

  logging.info(
    "JAX %s: %d processes, %d devices (%s)",
    jax.__version__,
    jax.process_count(),
    jax.device_count(),
    jax.devices()[0].device_kind,
  )
  try:
    result = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except preemption.Preempted:  # before training; with several processes, all of them here
    if _DISTRIBUTED.value:
      multihost.shutdown()
    raise
  except Exception:
    multihost.wait_for_lost_peer()  # a lost peer ends the process in one line, exit 75
    raise
  if _DISTRIBUTED.value:
    multihost.shutdown()
  if result["preempted"]:
    sys.exit(preemption.EXIT_PREEMPTED)
  texts = list(_CONFIG.value.log.fill_mask)
  if texts and jax.process_count() == 1 and result["step"] == _CONFIG.value.opt.total_steps:
    if files.is_remote(_WORKDIR.value):  # bert_jax.load reads local paths (or a gcsfuse mount)
      print("fill_mask: skipped (the workdir is on an object store)", flush=True)
    else:
      show_fill_mask(_WORKDIR.value, texts)


def show_fill_mask(workdir: str, texts: list[str], top_k: int = 3) -> None:
  """The final checkpoint's top predictions for each [MASK] of each text (stdout)."""
  import bert_jax

  m = bert_jax.load(workdir)
  for text in texts:
    shown = " / ".join(", ".join(f"{t} {p:.2f}" for t, p in pm) for pm in m.fill_mask(text, top_k))
    print(f"fill_mask: {text}  ->  {shown}", flush=True)


def run() -> None:
  preemption.run_command(
    lambda: cli.run(
      main,
      "main",
      compilation_cache=True,
      check=lambda: config_schema.check_pretraining(_CONFIG.value),
    )
  )


if __name__ == "__main__":
  run()
