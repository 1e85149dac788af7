#!/usr/bin/env bash
# The paper's ablations at scale=gpu (at least 20M tokens per pretraining point) on one GPU,
# within a deadline: the four sweeps of replicate_cpu.sh, run as parallel lanes on the one GPU
# (the points are small: one process leaves the GPU idle most of the time, and the lanes'
# compiles and host work use the machine's other cores).
#
#   bash tools/replication/replicate_gpu.sh [CORPUS] [DATA_DIR] [ROOT] [-- SWEEP FLAGS...]
#
# Defaults: ../shared/data/corpus/pretrain_corpus.txt.gz, /tmp/bert_jax_data,
# /tmp/bert_jax_gpu. Environment: BUDGET_S (540: the seconds from the script's start to its
# last line), MARGIN_S (120: kept after the sweeps' deadline for a stopped run to save, up to
# launch/sweep.py's 60 s grace, then the reports and this script's summary), SCALE (gpu),
# DOCS (127: build_data.sh), PYTHON.
#
#  1. the data (build_data.sh: CORPUS's first 127 documents, a vocab trained on them, and
#     they as sentence pairs and as packed sequences);
#  2. every pretraining point, in four parallel lanes;
#  3. every fine-tuning run and the four reports, one lane per experiment (--reuse links the
#     baseline point and the no-pretraining control between them, once Table 5 has them);
#  4. a summary: the reports, and what the deadline left undone.
# Every sweep gets --deadline (the script's start + BUDGET_S - MARGIN_S): at that time the run
# in flight is stopped (it saves), nothing more starts, <root>/deadline.json lists what did not
# run and the report covers what did. Rerunning the same command resumes where it stopped.
# The compilation cache (JAX's persistent cache, ROOT/jax_cache, every program however quick
# to compile) serves each later process the programs an earlier one compiled: every fine-tuning
# run of a task at one model size compiles the same steps.
#
# Tested on a CPU at toy size: tests/test_replicate_gpu.py (a deadline already past: nothing
# runs, every report lists what was skipped). Not yet run on a GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
CORPUS="${1:-../shared/data/corpus/pretrain_corpus.txt.gz}"
DATA="${2:-/tmp/bert_jax_data}"
ROOT="${3:-/tmp/bert_jax_gpu}"
shift $(($# < 3 ? $# : 3))
[[ "${1:-}" == "--" ]] && shift
EXTRA=("$@")
PY="${PYTHON:-python}"
SCALE="${SCALE:-gpu}"
BUDGET_S="${BUDGET_S:-540}"
MARGIN_S="${MARGIN_S:-120}"
DEADLINE=$((START + BUDGET_S - MARGIN_S))
LOGS="$ROOT/logs"
mkdir -p "$LOGS"

# The lanes share one GPU: no process takes most of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$ROOT/jax_cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0

stamp() { echo "[$(($(date +%s) - START))s] $*"; }
stamp "machine: $(nproc) cores; $("$PY" -c 'import jax; print(jax.devices()[0].device_kind)' 2>/dev/null)"
PYTHON="$PY" bash tools/replication/build_data.sh "$CORPUS" "$DATA" > "$LOGS/data.log" 2>&1 \
  || { stamp "data: failed (see $LOGS/data.log)"; exit 1; }
stamp "data: $DATA"

T5="experiments/table5_pretraining_tasks.py:scale=$SCALE,data=$DATA"
T6="experiments/table6_model_size.py:scale=$SCALE,data=$DATA"
WWM="experiments/whole_word_masking.py:scale=$SCALE,data=$DATA"
MASK="experiments/masking_static_vs_dynamic.py:scale=$SCALE,data=$DATA"

# sweep LOG ARGS...: one sweep, its output in LOGS/LOG.log; 75 (the deadline) is no failure.
# After the deadline only the sweeps that report run (each lists what it did not do).
sweep() {
  if (($(date +%s) >= DEADLINE)) && [[ " $* " == *" --stages="* ]]; then
    stamp "$1: skipped (past the deadline)"
    return
  fi
  local log="$1"
  shift
  "$PY" launch/sweep.py --deadline="$DEADLINE" "$@" "${EXTRA[@]}" > "$LOGS/$log.log" 2>&1
  local rc=$?
  stamp "$log: exit $rc$([[ $rc == 75 ]] && echo ' (deadline: rerun to finish)')"
}

# 2. Pretraining: the points in lanes of about equal work (the sizes grow down Table 6).
stamp "pretraining"
(sweep pre_table5 --experiment="$T5" --root="$ROOT/table5" --stages=pretrain) &
(sweep pre_table6a --experiment="$T6" --root="$ROOT/table6" --stages=pretrain \
  --only="row=L4_H128_A2;row=L2_H256_A4") &
(sweep pre_table6b --experiment="$T6" --root="$ROOT/table6" --stages=pretrain --only=row=mini) &
(sweep pre_wwm --experiment="$WWM" --root="$ROOT/wwm" --stages=pretrain --only=whole_word=True
  sweep pre_masking --experiment="$MASK" --root="$ROOT/masking" --stages=pretrain \
    --only=mode=dynamic) &
wait

# 3. Fine-tuning, one lane per experiment. The baseline point (Table 5's mlm_nsp: Table 6's
# tiny row, whole-word masking's pieces row and static masking are the same config, linked by
# --reuse) is fine-tuned by Table 5's lane only: two lanes must not run the same workdir.
stamp "fine-tuning"
(sweep table5 --experiment="$T5" --root="$ROOT/table5") &
(sweep ft_table6 --experiment="$T6" --root="$ROOT/table6" --stages=pretrain,finetune \
  --only="row=L4_H128_A2;row=L2_H256_A4;row=mini") &
(sweep ft_wwm --experiment="$WWM" --root="$ROOT/wwm" --stages=pretrain,finetune \
  --only=whole_word=True) &
(sweep ft_masking --experiment="$MASK" --root="$ROOT/masking" --stages=pretrain,finetune \
  --only=mode=dynamic) &
wait
# Then the experiments that share the baseline: linked, anything left, their reports.
for exp in table6 wwm masking; do
  case $exp in
    table6) spec="$T6" ;;
    wwm) spec="$WWM" ;;
    masking) spec="$MASK" ;;
  esac
  (sweep "$exp" --experiment="$spec" --root="$ROOT/$exp" --reuse="$ROOT/table5") &
done
wait

# 4. The summary.
for exp in table5 table6 wwm masking; do
  if [[ -f "$ROOT/$exp/deadline.json" ]]; then
    stamp "$exp: not done by the deadline: $("$PY" -c 'import json, sys
print(", ".join(json.load(open(sys.argv[1]))["not_done"]))' "$ROOT/$exp/deadline.json")"
  fi
  if [[ -f "$ROOT/$exp/report/results.md" ]]; then
    stamp "$exp: report $ROOT/$exp/report/results.md"
  else
    stamp "$exp: no report (see $LOGS/$exp.log)"
  fi
done
stamp "done"
