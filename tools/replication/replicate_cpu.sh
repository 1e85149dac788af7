#!/usr/bin/env bash
# The paper's ablations at scale=cpu, end to end (docs/replication.md): the data built once
# (tools/replication/build_data.sh: the corpus's first 127 documents, a vocab trained on them,
# and they as sentence pairs and as packed sequences), then every experiment's points
# (pretraining, fine-tuning on the downstream suite with 3 seeds and the no-pretraining
# control) and each experiment's report.
#
#   bash tools/replication/replicate_cpu.sh [CORPUS] [DATA_DIR] [ROOT] [-- SWEEP_FLAGS...]
#
# Defaults: ../shared/data/corpus/pretrain_corpus.txt.gz, /tmp/bert_jax_data, /tmp/bert_jax_repl.
# Rerunning after a kill (or exit 75) resumes: finished points and seeds are skipped, the
# interrupted run restarts from its checkpoint. Not yet timed end to end on an idle machine:
# the runs of 2026-11-27 and 28 and their wall times are in docs/replication.md.
#
# The new points run as two lanes, two processes at a time: a tiny BERT's steps leave part of
# 2 cores idle, and two lanes got through about 1.3 times the work of one (docs/replication.md).
# Each lane's output goes to ROOT/logs/lane_{a,b}.log. Then one sweep per experiment links
# what is shared (--reuse: every experiment's baseline is Table 5's mlm_nsp point, one config:
# tiny, MLM + NSP, static masks of pieces, with its fine-tuning and the control) and writes
# the report.
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="${1:-../shared/data/corpus/pretrain_corpus.txt.gz}"
DATA="${2:-/tmp/bert_jax_data}"
ROOT="${3:-/tmp/bert_jax_repl}"
shift $(($# < 3 ? $# : 3))
[[ "${1:-}" == "--" ]] && shift
EXTRA=("$@")  # passed to every launch/sweep.py (e.g. --dry_run: print the commands only)
PY="${PYTHON:-python}"
LOGS="$ROOT/logs"
mkdir -p "$LOGS"
START=$(date +%s)
stamp() { echo "[$(($(date +%s) - START))s] $*"; }

PYTHON="$PY" bash tools/replication/build_data.sh "$CORPUS" "$DATA"

T5="experiments/table5_pretraining_tasks.py:scale=cpu,data=$DATA"
T6="experiments/table6_model_size.py:scale=cpu,data=$DATA"
WWM="experiments/whole_word_masking.py:scale=cpu,data=$DATA"
MASK="experiments/masking_static_vs_dynamic.py:scale=cpu,data=$DATA"
points() {  # EXPERIMENT ROOT ONLY: those points' pretraining and fine-tuning, no report
  "$PY" launch/sweep.py --experiment="$1" --root="$2" --only="$3" --stages=pretrain,finetune \
    "${EXTRA[@]}"
}
report() {  # EXPERIMENT ROOT [--reuse=...]: what is left (links to reused runs), the report
  "$PY" launch/sweep.py --experiment="$1" --root="$2" "${@:3}" "${EXTRA[@]}"
}

# Two lanes of about equal cost: alone on 2 cores a tiny MLM point takes 13 to 15 minutes,
# LTR about 35 (6,100 tokens/s against 17,000) and its squadshifts runs about 13 each, the
# larger Table 6 rows 3 to 4 times a tiny point (beside other runs); fine-tuning 3 to 5 each.
stamp "points: two lanes (logs: $LOGS/lane_a.log, $LOGS/lane_b.log)"
(
  set -e
  points "$T5" "$ROOT/table5" "task=mlm_nsp;task=mlm"
  points "$T6" "$ROOT/table6" "row=L2_H256_A4"
  points "$MASK" "$ROOT/masking" "mode=dynamic"
) > "$LOGS/lane_a.log" 2>&1 &
LANE_A=$!
(
  set -e
  points "$T5" "$ROOT/table5" "task=ltr"
  points "$WWM" "$ROOT/wwm" "whole_word=True"
  points "$T6" "$ROOT/table6" "row=L4_H128_A2"
) > "$LOGS/lane_b.log" 2>&1 &
LANE_B=$!
trap 'kill -TERM $LANE_A $LANE_B 2>/dev/null' TERM INT HUP  # the sweeps pass it on and save
rc=0
wait $LANE_A || rc=$?
stamp "lane a: exit $rc"
rc_b=0
wait $LANE_B || rc_b=$?
stamp "lane b: exit $rc_b"
trap - TERM INT HUP
if ((rc != 0 || rc_b != 0)); then
  stamp "stopped: rerun the same command to finish (75: preempted, resumable; else see the logs)"
  exit $((rc != 0 ? rc : rc_b))
fi

stamp "reports"
report "$T5" "$ROOT/table5"
report "$WWM" "$ROOT/wwm" --reuse="$ROOT/table5"
report "$T6" "$ROOT/table6" --reuse="$ROOT/table5"
report "$MASK" "$ROOT/masking" --reuse="$ROOT/table5"
stamp "reports: $ROOT/{table5,wwm,table6,masking}/report/results.md"
