#!/usr/bin/env bash
# The paper's ablations at a reduced scale, end to end (docs/replication.md): the data built
# once (tools/replication/build_data.sh), the downstream tasks (build_tasks.sh), every
# pretraining point with its pretraining seeds, every point's fine-tuning, and the reports
# (each experiment's, and the verdicts across experiments). replicate_cpu.sh and
# replicate_gpu.sh run it with their scale's settings.
#
#   SCALE=cpu bash tools/replication/replicate.sh CORPUS DATA_DIR ROOT [-- SWEEP_FLAGS...]
#
# Environment: SCALE (cpu or gpu), STAGES (default "pretrain finetune report"), LANES (2: the
# processes at a time), DEADLINE (unix seconds: no run starts after it and the one in flight
# is stopped there, saving; launch/sweep.py --deadline), QUEUE_FILTER (a grep -E pattern: only
# the queue's lines that match, e.g. '^table5 task=mlm_nsp,seed=0$'; then nothing is linked
# between experiments), TASKS (a '+'-separated subset of the downstream tasks: fine-tune only
# those, e.g. one task over every point first), TASK_ROOT (../shared/data/tasks), PYTHON.
# Rerunning after a kill, an
# exit 75 or a deadline resumes: finished runs are skipped, an interrupted one restarts from its
# checkpoint.
#
# Runs go through a queue that LANES processes take from in order (a tiny BERT's step leaves
# part of 2 cores idle: two lanes got through about 1.3 times the work of one). The queue
# (tools/replication/run_queue.py) has the compared points first, the cheapest with all their
# seeds first, so that a run stopped early has whole comparisons of 3 runs a side; the points
# pretrained once come last. Each run's output goes to
# ROOT/logs/<phase>/<experiment>_<point>.log, and ROOT/logs/timeline.tsv gets a line when each
# starts and ends (unix time, phase, experiment, point, exit status).
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="$1"
DATA="$2"
ROOT="$3"
shift 3
[[ "${1:-}" == "--" ]] && shift
PY="${PYTHON:-python}"
TASK_ROOT="${TASK_ROOT:-../shared/data/tasks}"
SCALE="${SCALE:-cpu}"
STAGES="${STAGES:-pretrain finetune report}"
LANES="${LANES:-2}"
DEADLINE="${DEADLINE:-}"
QUEUE_FILTER="${QUEUE_FILTER:-.}"
TASKS="${TASKS:-}"
LOGS="$ROOT/logs"
mkdir -p "$LOGS"
START=$(date +%s)
stamp() { echo "[$(($(date +%s) - START))s] $*"; }

PYTHON="$PY" bash tools/replication/build_data.sh "$CORPUS" "$DATA"

EXPERIMENTS="table5 table6 masking wwm"
spec() {  # EXPERIMENT -> FILE:ARG
  case $1 in
    table5) echo -n "experiments/table5_pretraining_tasks.py" ;;
    table6) echo -n "experiments/table6_model_size.py" ;;
    masking) echo -n "experiments/masking_static_vs_dynamic.py" ;;
    wwm) echo -n "experiments/whole_word_masking.py" ;;
  esac
  echo ":scale=$SCALE,data=$DATA${TASKS:+,tasks=$TASKS}"
}
# one PHASE EXPERIMENT POINT: one point's PHASE (a sweep --only=POINT, with $SWEEP_FLAGS),
# logged; SIGTERM/SIGINT/SIGHUP are passed on to the sweep (which passes them on to its run:
# it saves and exits 75).
one() {
  local phase=$1 exp=$2 point=$3
  mkdir -p "$LOGS/$phase"
  local log="$LOGS/$phase/${exp}_${point//[=,]/_}.log"
  local deadline=()
  if [[ -n $DEADLINE ]]; then
    if (($(date +%s) >= DEADLINE)); then
      printf '%s\tskipped (deadline)\t%s\t%s\t%s\n' "$(date +%s)" "$phase" "$exp" "$point" \
        >> "$LOGS/timeline.tsv"
      return 75
    fi
    deadline=(--deadline="$DEADLINE")
  fi
  printf '%s\tstart\t%s\t%s\t%s\n' "$(date +%s)" "$phase" "$exp" "$point" >> "$LOGS/timeline.tsv"
  # shellcheck disable=SC2086  # SWEEP_FLAGS: flags without spaces, split on purpose
  "$PY" launch/sweep.py --experiment="$(spec "$exp")" --root="$ROOT/$exp" --only="$point" \
    --stages="$phase" "${deadline[@]}" $SWEEP_FLAGS >> "$log" 2>&1 &
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
export PY ROOT LOGS DATA SCALE DEADLINE TASKS
export SWEEP_FLAGS="$*"

# The runs of every experiment, one "EXPERIMENT POINT" a line (tools/replication/run_queue.py),
# each pretraining config once (Table 6's tiny row, static masking and masking pieces are
# Table 5's baseline: their sweeps link it later).
queue() {
  "$PY" tools/replication/run_queue.py --data="$DATA" --scale="$SCALE" | grep -E -- "$QUEUE_FILTER"
}

# stop_lanes XARGS_PID: xargs stopped first (else it starts the next run), then the sweeps.
stop_lanes() {
  local ones sweeps
  ones=$(pgrep -P "$1" || true)
  sweeps=$(for p in $ones; do pgrep -P "$p" || true; done)
  kill -TERM "$1" 2> /dev/null || true
  # shellcheck disable=SC2086
  [[ -z $sweeps ]] || kill -TERM $sweeps 2> /dev/null || true
}

# lanes PHASE: the queue's runs of PHASE, LANES at a time.
lanes() {
  local phase=$1
  stamp "$phase: $LANES lanes (logs: $LOGS/$phase/, timeline: $LOGS/timeline.tsv)"
  queue > "$LOGS/queue_$phase.txt"  # one per phase: two drivers may run side by side
  xargs -P "$LANES" -L 1 bash -c 'one "$0" "$1" "$2"' "$phase" < "$LOGS/queue_$phase.txt" &
  local xargs_pid=$! rc=0
  # A signal to this script stops xargs (nothing more starts) and goes to every running sweep
  # (which passes it on to its run: it saves and exits 75).
  trap 'stamp "stopping: the runs save; rerun the same command to resume"
        stop_lanes $xargs_pid' TERM INT HUP
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
  if [[ $QUEUE_FILTER != . ]]; then
    stamp "links: skipped (QUEUE_FILTER: a part of the queue only)"
    return 0
  fi
  for exp in $EXPERIMENTS; do
    local reuse=()
    [[ $exp == table5 ]] || reuse=(--reuse="$ROOT/table5")
    [[ -z $DEADLINE ]] || reuse+=(--deadline="$DEADLINE")
    # shellcheck disable=SC2086
    "$PY" launch/sweep.py --experiment="$(spec "$exp")" --root="$ROOT/$exp" \
      --stages=pretrain,finetune "${reuse[@]}" $SWEEP_FLAGS >> "$LOGS/link.log" 2>&1 || rc=$?
  done
  stamp "links: exit $rc (log: $LOGS/link.log)"
  return $rc
}

status=0
for stage in $STAGES; do
  case $stage in
    pretrain) lanes pretrain || status=$? ;;
    finetune)
      PYTHON="$PY" bash tools/replication/build_tasks.sh "$DATA/tasks" "$TASK_ROOT"
      lanes finetune || status=$?
      link || status=$?
      ;;
    report)
      # Each experiment's report covers what finished (the verdicts list what did not).
      for exp in $EXPERIMENTS; do
        # A call filtered to part of the queue (QUEUE_FILTER) may have run nothing of it yet.
        [[ -d "$ROOT/$exp" ]] || { stamp "report $exp: no runs under $ROOT/$exp"; continue; }
        paper=$("$PY" -c "import sys; sys.path.insert(0, 'launch'); import sweep
print(sweep.experiment_paper('$(spec "$exp" | cut -d: -f1)'))")
        "$PY" -m bert_jax.report --root="$ROOT/$exp" --paper="$paper" > "$LOGS/report_$exp.log" \
          2>&1 || stamp "report $exp: failed (see $LOGS/report_$exp.log)"
      done
      "$PY" -m bert_jax.report --root="$ROOT" --verdicts > "$LOGS/verdicts.log" 2>&1 \
        || stamp "verdicts: failed (see $LOGS/verdicts.log)"
      stamp "reports: $ROOT/<experiment>/report/results.md, $ROOT/report/verdicts.md"
      ;;
    *) echo "replicate.sh: error: STAGES: unknown stage $stage" >&2; exit 2 ;;
  esac
done
# 0: everything ran; else some run failed or was left (the timeline and the logs say which):
# rerun the same command to resume.
stamp "exit $status"
exit $status
