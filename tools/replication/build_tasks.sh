#!/usr/bin/env bash
# The downstream tasks the replication builds (experiments/_downstream.py: BUILT), once:
#   TASKS/squad_qnli   QNLI's construction from squadshifts (question + sentence: does it hold
#                      the answer?), train/dev/test grouped by article or context
#   TASKS/squad_split  the same questions as SQuAD v1.1 JSON with grouped train/dev/test
# (tools/tasks/make_squad_tasks.py). The shared tasks (brown_pos, rotten_tomatoes, vitaminc)
# are read where they are (configs/finetune.py's data_root).
#
#   bash tools/replication/build_tasks.sh TASKS [DATA_ROOT]
#
# Skipped when TASKS/squad_split/meta.json is there (written last).
set -euo pipefail
cd "$(dirname "$0")/../.."
TASKS="$1"
DATA_ROOT="${2:-../shared/data/tasks}"
PY="${PYTHON:-python}"
if [[ ! -f "$TASKS/squad_split/meta.json" ]]; then
  "$PY" tools/tasks/make_squad_tasks.py --data_root="$DATA_ROOT" --output="$TASKS"
fi
