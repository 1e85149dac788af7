#!/usr/bin/env bash
# The pretraining data of the reduced-scale experiments (config_lib.use_data), built once:
#   DATA/vocab.txt   a WordPiece vocab of config_lib.SCALED_VOCAB entries trained on CORPUS
#   DATA/corpus.txt  every EVERY-th document of CORPUS (default 8: 1,014 of the 62 MB corpus's
#                    8,112 documents, 2.2M tokens), so that a point's budget reads it several
#                    times, as BERT read its corpus about 40 times (docs/replication.md)
#   DATA/nsp         DATA/corpus.txt as sentence pairs (create_data, 1% of documents held out)
#   DATA/packed      the same as packed full sentences (--nsp=False), for the rows without NSP
#
#   EVERY=8 bash tools/replication/build_data.sh CORPUS DATA
#
# Each step is skipped when its output is there (a rerun after a kill redoes only the rest).
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS="$1"
DATA="$2"
EVERY="${EVERY:-8}"
PY="${PYTHON:-python}"
mkdir -p "$DATA"

VOCAB_SIZE=$("$PY" -c 'from bert_jax import config_lib; print(config_lib.SCALED_VOCAB)')
if [[ ! -f "$DATA/vocab.txt" ]]; then
  "$PY" -m bert_jax.train_tokenizer --input="$CORPUS" --kind=wordpiece \
    --vocab_size="$VOCAB_SIZE" --output="$DATA/vocab.txt.tmp"
  mv "$DATA/vocab.txt.tmp" "$DATA/vocab.txt"
fi
if [[ ! -f "$DATA/corpus.txt" ]]; then
  # Documents are separated by blank lines (awk's paragraph mode reads one per record).
  case "$CORPUS" in
    *.gz) gzip -dc "$CORPUS" ;;
    *) cat "$CORPUS" ;;
  esac | awk -v every="$EVERY" 'BEGIN { RS = ""; ORS = "\n\n" } NR % every == 0' \
    > "$DATA/corpus.txt.tmp"
  mv "$DATA/corpus.txt.tmp" "$DATA/corpus.txt"
fi
for kind in nsp packed; do
  if [[ ! -f "$DATA/$kind/metadata.json" ]]; then
    nsp=$([[ $kind == nsp ]] && echo --nsp=True || echo --nsp=False)
    "$PY" -m bert_jax.create_data --input="$DATA/corpus.txt" --output_dir="$DATA/$kind" \
      --vocab="$DATA/vocab.txt" --eval_fraction=0.01 "$nsp" --noprogress --overwrite
  fi
done
