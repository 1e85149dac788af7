#!/usr/bin/env bash
# The paper's ablations at scale=cpu, end to end (docs/replication.md): the data built once
# (tools/replication/build_data.sh: the corpus's first 127 documents, a vocab trained on them,
# and they as sentence pairs and as packed sequences), then one sweep per experiment
# (pretraining, fine-tuning on the downstream suite with 3 seeds and the no-pretraining
# control, the report).
#
#   bash tools/replication/replicate_cpu.sh [CORPUS] [DATA_DIR] [ROOT]
#
# Defaults: ../shared/data/corpus/pretrain_corpus.txt.gz, /tmp/bert_jax_data, /tmp/bert_jax_repl.
# Rerunning after a kill (or exit 75) resumes: finished points and seeds are skipped, the
# interrupted run restarts from its checkpoint. Sized for about 3 hours on 2 CPU cores (not yet
# timed: docs/replication/budget.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="${1:-../shared/data/corpus/pretrain_corpus.txt.gz}"
DATA="${2:-/tmp/bert_jax_data}"
ROOT="${3:-/tmp/bert_jax_repl}"
PY="${PYTHON:-python}"

PYTHON="$PY" bash tools/replication/build_data.sh "$CORPUS" "$DATA"
# Table 5 first: the other experiments' baselines are its mlm_nsp point (one config: tiny,
# MLM + NSP, static masks of pieces), linked by --reuse with its fine-tuning and the control.
"$PY" launch/sweep.py --experiment="experiments/table5_pretraining_tasks.py:scale=cpu,data=$DATA" \
  --root="$ROOT/table5"
"$PY" launch/sweep.py --experiment="experiments/whole_word_masking.py:scale=cpu,data=$DATA" \
  --root="$ROOT/wwm" --reuse="$ROOT/table5"
"$PY" launch/sweep.py --experiment="experiments/table6_model_size.py:scale=cpu,data=$DATA" \
  --root="$ROOT/table6" --reuse="$ROOT/table5"
"$PY" launch/sweep.py --experiment="experiments/masking_static_vs_dynamic.py:scale=cpu,data=$DATA" \
  --root="$ROOT/masking" --reuse="$ROOT/table5"
echo "reports: $ROOT/{table5,wwm,table6,masking}/report/results.md"
