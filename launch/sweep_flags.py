"""launch/sweep.py's own flags (absl, on a FlagValues of their own: tests call its main()
repeatedly and bert_jax's modules define flags of the same names)."""

from __future__ import annotations

from absl import flags

STAGES = ("pretrain", "finetune", "report")
BACKENDS = ("local", "slurm", "tpu_vm")

# The sweep's own flags (absl, on a FlagValues of their own: tests call main() repeatedly and
# bert_jax's modules define flags of the same names). --config.KEY=VALUE and
# --finetune.KEY=VALUE pass through to the runs, so they are split off before absl sees them.
FLAGS = flags.FlagValues()
flags.DEFINE_string(
  "experiment", None, "FILE.py[:ARG]: the experiment file and its ARG.", flag_values=FLAGS
)
flags.DEFINE_string("root", None, "Directory of the sweep: a workdir per point.", flag_values=FLAGS)
flags.DEFINE_string(
  "only", None, "Points by name or values, separated by ';' (default: all).", flag_values=FLAGS
)
flags.DEFINE_list("stages", list(STAGES), "What runs: pretrain,finetune,report.", flag_values=FLAGS)
flags.DEFINE_string("backend", "local", "local, slurm or tpu_vm.", flag_values=FLAGS)
flags.DEFINE_list(
  "reuse",
  [],
  "local: roots whose finished points with the same config are linked.",
  flag_values=FLAGS,
)
flags.DEFINE_bool(
  "distributed",
  False,
  "Every run is one multi-process JAX job (--distributed).",
  flag_values=FLAGS,
)
flags.DEFINE_bool(
  "dry_run",
  False,
  "Print the commands (or the scheduler's script); run nothing.",
  flag_values=FLAGS,
)
flags.DEFINE_string(
  "sbatch",
  "",
  "slurm: sbatch options of the array job, e.g. '--partition=gpu --gpus=1 "
  "--time=8:00:00' (they override the script's #SBATCH lines).",
  flag_values=FLAGS,
)
flags.DEFINE_string(
  "sbatch_report", "", "slurm: sbatch options of the report job.", flag_values=FLAGS
)
flags.DEFINE_string(
  "deadline",
  None,
  "local: a time (unix seconds, or +SECONDS from now) when the run in flight is stopped "
  "(SIGTERM: it saves) and nothing more starts; <root>/deadline.json lists what did not run, "
  "the report covers what did, and the exit status is 75 (rerun to finish).",
  flag_values=FLAGS,
)
flags.DEFINE_list(
  "report_requires",
  None,
  "The stages whose runs must be done (sweep_done.json) before the "
  "report stage reports (default: the other --stages; all of them for --stages=report).",
  flag_values=FLAGS,
)
