#!/usr/bin/env bash
# The paper's ablations at scale=cpu, end to end, on a 2-core machine (docs/replication.md):
# tools/replication/replicate.sh with two lanes.
#
#   bash tools/replication/replicate_cpu.sh [CORPUS] [DATA_DIR] [ROOT] [-- SWEEP_FLAGS...]
#
# Defaults: ../shared/data/corpus/pretrain_corpus.txt.gz, /tmp/bert_jax_data, /tmp/bert_jax_repl.
# STAGES ("pretrain finetune report") picks the phases, LANES (2) the processes at a time.
# Rerun the same command after a kill (or exit 75): finished runs are skipped, the interrupted
# one resumes from its checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="${1:-../shared/data/corpus/pretrain_corpus.txt.gz}"
DATA="${2:-/tmp/bert_jax_data}"
ROOT="${3:-/tmp/bert_jax_repl}"
shift $(($# < 3 ? $# : 3))
[[ "${1:-}" == "--" ]] && shift
SCALE=cpu LANES="${LANES:-2}" exec bash tools/replication/replicate.sh "$CORPUS" "$DATA" "$ROOT" \
  -- "$@"
