#!/usr/bin/env bash
# The downstream tasks of the replication (experiments/_downstream.py), in one folder that an
# experiment's data=DIR reads (DIR/tasks) and that travels to a GPU machine with the data:
#   TASKS/squad_qnli   QNLI's construction from squadshifts (question + sentence: does it hold
#                      the answer?), train/dev/test grouped by article or context
#   TASKS/squad_split  the same questions as SQuAD v1.1 JSON with grouped train/dev/test
#                      (both tools/tasks/make_squad_tasks.py)
#   TASKS/{brown_pos,rotten_tomatoes,vitaminc}   copies of DATA_ROOT's
#
#   bash tools/replication/build_tasks.sh TASKS [DATA_ROOT]   # DATA_ROOT: ../shared/data/tasks
#
# Each task is skipped when its folder is complete (squad_split's meta.json is written last).
set -euo pipefail
cd "$(dirname "$0")/../.."
TASKS="$1"
DATA_ROOT="${2:-../shared/data/tasks}"
PY="${PYTHON:-python}"
if [[ ! -f "$TASKS/squad_split/meta.json" ]]; then
  "$PY" tools/tasks/make_squad_tasks.py --data_root="$DATA_ROOT" --output="$TASKS"
fi
for task in brown_pos rotten_tomatoes vitaminc; do
  if [[ ! -f "$TASKS/$task/test.jsonl.gz" ]]; then
    mkdir -p "$TASKS/$task.tmp"
    cp "$DATA_ROOT/$task"/{train,dev,test}.jsonl.gz "$TASKS/$task.tmp/"
    rm -rf "$TASKS/$task" && mv "$TASKS/$task.tmp" "$TASKS/$task"
  fi
done
