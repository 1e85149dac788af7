#!/usr/bin/env bash
# The pretraining data of the reduced-scale experiments (config_lib.use_data), built once:
#   DATA/corpus.txt  the first DOCS documents of CORPUS (default 127: the 62 MB corpus's first
#                    2 MB, Jane Austen's Emma and what follows it, about 0.5M tokens): one
#                    narrow domain, which a tiny BERT learns within the cpu budget; on documents
#                    drawn from the whole corpus it stays on the unigram plateau for that budget
#                    (docs/notes/budget.md)
#   DATA/vocab.txt   a WordPiece vocab of config_lib.SCALED_VOCAB entries trained on it
#   DATA/nsp         DATA/corpus.txt as sentence pairs (create_data, EVAL_FRACTION (0.05) of
#                    documents held out, DUPE (5) passes with their own masks and pairs: 2.3M
#                    tokens, so each static mask comes back about 5 times in a cpu point's 12.3M
#                    tokens, as BERT's 10 passes over 40 epochs did 4 times). Every point reads
#                    it, Table 5's rows without NSP too, so that they change only the objective.
#
#   DOCS=127 bash tools/replication/build_data.sh CORPUS DATA
#   # the QNLI lane's prose (docs/replication.md): books, State of the Union, Hansard
#   DOCS=2688 DUPE=2 EVAL_FRACTION=0.02 bash tools/replication/build_data.sh CORPUS DATA
#
# Each step is skipped when its output is there (a rerun after a kill redoes only the rest).
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="$1"
DATA="$2"
DOCS="${DOCS:-127}"
DUPE="${DUPE:-5}"
EVAL_FRACTION="${EVAL_FRACTION:-0.05}"
PY="${PYTHON:-python}"
mkdir -p "$DATA"

# (An assignment, not `read < <(...)`, so that set -e stops here if Python fails.)
SCALED=$("$PY" -c 'from bert_jax import config_lib as c
print(c.SCALED_VOCAB, c.SCALED_LENGTH, c.SCALED_PREDICTIONS)')
read -r VOCAB_SIZE LENGTH PREDICTIONS <<< "$SCALED"
if [[ ! -f "$DATA/corpus.txt" ]]; then
  # Documents are separated by blank lines (awk's paragraph mode reads one per record).
  case "$CORPUS" in
    *.gz) gzip -dc "$CORPUS" ;;
    *) cat "$CORPUS" ;;
  esac | awk -v docs="$DOCS" 'BEGIN { RS = ""; ORS = "\n\n" } NR <= docs' \
    > "$DATA/corpus.txt.tmp"
  mv "$DATA/corpus.txt.tmp" "$DATA/corpus.txt"
fi
if [[ ! -f "$DATA/vocab.txt" ]]; then
  "$PY" -m bert_jax.train_tokenizer --input="$DATA/corpus.txt" --kind=wordpiece \
    --vocab_size="$VOCAB_SIZE" --output="$DATA/vocab.txt.tmp"
  mv "$DATA/vocab.txt.tmp" "$DATA/vocab.txt"
fi
if [[ ! -f "$DATA/nsp/metadata.json" ]]; then
  "$PY" -m bert_jax.create_data --input="$DATA/corpus.txt" --output_dir="$DATA/nsp" \
    --vocab="$DATA/vocab.txt" --eval_fraction="$EVAL_FRACTION" --dupe_factor="$DUPE" \
    --max_seq_length="$LENGTH" --max_predictions_per_seq="$PREDICTIONS" --nsp=True \
    --noprogress --overwrite
else  # built before: with these passes and held-out share, or say so (nothing is rebuilt)
  "$PY" - "$DATA/nsp/metadata.json" "$DUPE" "$EVAL_FRACTION" << 'EOF'
import json, sys
path, dupe, fraction = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
meta = json.load(open(path))
built = meta.get("dupe_factor"), meta.get("eval_fraction")
if built != (dupe, fraction):
  sys.exit(f"build_data.sh: error: {path} was built with DUPE={built[0]} "
           f"EVAL_FRACTION={built[1]}, not {dupe} and {fraction}: use another DATA")
EOF
fi
