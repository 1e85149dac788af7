#!/usr/bin/env bash
# The paper's ablations at cpu scale, end to end (docs/replication.md has the results):
# the 62 MB corpus built once (sentence pairs and packed sequences), then one sweep per
# experiment (pretraining, fine-tuning on the downstream suite with 3 seeds, the report).
#
#   bash tools/replication/replicate_cpu.sh [CORPUS] [DATA_DIR] [ROOT]
#
# Defaults: ../shared/data/corpus/pretrain_corpus.txt.gz, /tmp/bert_jax_data, /tmp/bert_jax_repl.
# Rerunning after a kill (or exit 75) resumes: finished points and seeds are skipped, the
# interrupted run restarts from its checkpoint. About 2 hours on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="${1:-../shared/data/corpus/pretrain_corpus.txt.gz}"
DATA="${2:-/tmp/bert_jax_data}"
ROOT="${3:-/tmp/bert_jax_repl}"
PY="${PYTHON:-python}"

for kind in nsp packed; do
  if [[ ! -f "$DATA/$kind/metadata.json" ]]; then
    flag=$([[ $kind == nsp ]] && echo --nsp=True || echo --nsp=False)
    "$PY" -m bert_jax.create_data --input="$CORPUS" --output_dir="$DATA/$kind" \
      --eval_fraction=0.01 "$flag" --noprogress
  fi
done
# Table 5 first: the other experiments' baselines are its mlm_nsp point (--reuse links it).
"$PY" launch/sweep.py --experiment="experiments/table5_pretraining_tasks.py:scale=cpu,data=$DATA" \
  --root="$ROOT/table5"
"$PY" launch/sweep.py --experiment="experiments/whole_word_masking.py:scale=cpu,data=$DATA" \
  --root="$ROOT/wwm" --reuse="$ROOT/table5"
"$PY" launch/sweep.py --experiment="experiments/table6_model_size.py:scale=cpu,data=$DATA" \
  --root="$ROOT/table6" --reuse="$ROOT/table5"
# Static vs dynamic masking reads the bundled corpus (see the experiment's docstring).
"$PY" launch/sweep.py --experiment=experiments/masking_static_vs_dynamic.py:scale=cpu \
  --root="$ROOT/masking"
echo "reports: $ROOT/{table5,wwm,table6,masking}/report/results.md"
