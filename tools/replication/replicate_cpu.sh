#!/usr/bin/env bash
# The paper's ablations at scale=cpu, end to end (docs/replication.md): the data built once
# (tools/replication/build_data.sh), every pretraining point with its pretraining seeds, the
# downstream tasks (tools/replication/build_tasks.sh), every point's fine-tuning, and the
# reports (each experiment's, and the verdicts across experiments).
#
#   bash tools/replication/replicate_cpu.sh [CORPUS] [DATA_DIR] [ROOT] [-- SWEEP_FLAGS...]
#
# Defaults: ../shared/data/corpus/pretrain_corpus.txt.gz, /tmp/bert_jax_data, /tmp/bert_jax_repl.
# STAGES (default "pretrain finetune report") picks the phases; LANES (2) the processes at a
# time. Rerunning after a kill (or exit 75) resumes: finished runs are skipped, the interrupted
# one restarts from its checkpoint.
#
# Runs go through a queue that LANES processes take from in order (a tiny BERT's step leaves
# part of 2 cores idle: two lanes got through about 1.3 times the work of one). The queue is
# seed by seed (all of seed 0's compared points, then seed 1's, ...), so that a run stopped
# early has whole comparisons first; the points pretrained once come last. Each run's output
# goes to ROOT/logs/<phase>/<experiment>_<point>.log, and ROOT/logs/timeline.tsv gets a line
# when each starts and ends (unix time, phase, experiment, point, exit status).
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="${1:-../shared/data/corpus/pretrain_corpus.txt.gz}"
DATA="${2:-/tmp/bert_jax_data}"
ROOT="${3:-/tmp/bert_jax_repl}"
shift $(($# < 3 ? $# : 3))
[[ "${1:-}" == "--" ]] && shift
PY="${PYTHON:-python}"
STAGES="${STAGES:-pretrain finetune report}"
LANES="${LANES:-2}"
LOGS="$ROOT/logs"
mkdir -p "$LOGS"
START=$(date +%s)
stamp() { echo "[$(($(date +%s) - START))s] $*"; }

PYTHON="$PY" bash tools/replication/build_data.sh "$CORPUS" "$DATA"

EXPERIMENTS="table5 table6 masking wwm"
spec() {  # EXPERIMENT -> FILE:ARG
  case $1 in
    table5) echo "experiments/table5_pretraining_tasks.py:scale=cpu,data=$DATA" ;;
    table6) echo "experiments/table6_model_size.py:scale=cpu,data=$DATA" ;;
    masking) echo "experiments/masking_static_vs_dynamic.py:scale=cpu,data=$DATA" ;;
    wwm) echo "experiments/whole_word_masking.py:scale=cpu,data=$DATA" ;;
  esac
}
# one PHASE EXPERIMENT POINT: one point's PHASE (a sweep --only=POINT, with $SWEEP_FLAGS),
# logged; SIGTERM/SIGINT/SIGHUP are passed on to the sweep (which passes them on to its run:
# it saves and exits 75).
one() {
  local phase=$1 exp=$2 point=$3
  mkdir -p "$LOGS/$phase"
  local log="$LOGS/$phase/${exp}_${point//[=,]/_}.log"
  printf '%s\tstart\t%s\t%s\t%s\n' "$(date +%s)" "$phase" "$exp" "$point" >> "$LOGS/timeline.tsv"
  # shellcheck disable=SC2086  # SWEEP_FLAGS: flags without spaces, split on purpose
  "$PY" launch/sweep.py --experiment="$(spec "$exp")" --root="$ROOT/$exp" --only="$point" \
    --stages="$phase" $SWEEP_FLAGS >> "$log" 2>&1 &
  local pid=$!
  trap 'kill -TERM $pid 2>/dev/null' TERM INT HUP
  local rc=0
  wait $pid || rc=$?
  while kill -0 $pid 2>/dev/null; do wait $pid || rc=$?; done  # a signal interrupts the wait
  printf '%s\tend\t%s\t%s\t%s\t%s\n' "$(date +%s)" "$phase" "$exp" "$point" "$rc" \
    >> "$LOGS/timeline.tsv"
  return $rc
}
export -f one spec
export PY ROOT LOGS DATA
export SWEEP_FLAGS="$*"

# The runs of every experiment, one "EXPERIMENT POINT" a line: seed by seed, the compared
# points before those pretrained once, and each pretraining config once (Table 6's tiny row,
# static masking and masking pieces are Table 5's baseline: their sweeps link it later).
queue() {
  "$PY" tools/replication/queue.py --data="$DATA" --scale=cpu
}

# lanes PHASE: the queue's runs of PHASE, LANES at a time.
lanes() {
  local phase=$1
  stamp "$phase: $LANES lanes (logs: $LOGS/$phase/, timeline: $LOGS/timeline.tsv)"
  queue > "$LOGS/queue.txt"
  xargs -P "$LANES" -L 1 bash -c 'one "$0" "$1" "$2"' "$phase" < "$LOGS/queue.txt" &
  local xargs_pid=$! rc=0
  # A signal to this script goes to every running `one` (each passes it on to its sweep).
  trap 'stamp "stopping: the runs save; rerun the same command to resume"
        pkill -TERM -P $xargs_pid' TERM INT HUP
  wait $xargs_pid || rc=$?
  while kill -0 $xargs_pid 2>/dev/null; do wait $xargs_pid || rc=$?; done
  trap - TERM INT HUP
  stamp "$phase: exit $rc"
  return $rc
}

# link: each experiment's whole sweep, one after another: it links what it shares with Table 5
# (--reuse: the baseline point with its fine-tuning, and the no-pretraining control) and runs
# anything the lanes left.
link() {
  local rc=0
  for exp in $EXPERIMENTS; do
    local reuse=()
    [[ $exp == table5 ]] || reuse=(--reuse="$ROOT/table5")
    # shellcheck disable=SC2086
    "$PY" launch/sweep.py --experiment="$(spec "$exp")" --root="$ROOT/$exp" \
      --stages=pretrain,finetune "${reuse[@]}" $SWEEP_FLAGS >> "$LOGS/link.log" 2>&1 || rc=$?
  done
  stamp "links: exit $rc (log: $LOGS/link.log)"
  return $rc
}

for stage in $STAGES; do
  case $stage in
    pretrain) lanes pretrain ;;
    finetune)
      PYTHON="$PY" bash tools/replication/build_tasks.sh "$DATA/tasks"
      lanes finetune
      link
      ;;
    report)
      for exp in $EXPERIMENTS; do
        # shellcheck disable=SC2086
        "$PY" launch/sweep.py --experiment="$(spec "$exp")" --root="$ROOT/$exp" \
          --stages=report --report_requires=pretrain,finetune $SWEEP_FLAGS
      done
      "$PY" -m bert_jax.report --root="$ROOT" --verdicts
      stamp "reports: $ROOT/{$(echo $EXPERIMENTS | tr ' ' ,)}/report/results.md, $ROOT/report/verdicts.md"
      ;;
    *) echo "replicate_cpu.sh: error: STAGES: unknown stage $stage" >&2; exit 2 ;;
  esac
done
