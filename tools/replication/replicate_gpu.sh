#!/usr/bin/env bash
# The paper's ablations at scale=gpu on one GPU (tools/replication/replicate.sh with LANES
# processes sharing the GPU), in calls of at most 9 minutes that a warm machine runs back to
# back: each call stops its runs at its deadline (they save), and the same command resumes.
#
# Here, once (a checkout with ../shared): the data and tasks it needs, in gpu_data/ (git-ignored,
# about 20 MB: the corpus's first 127 documents, their vocab and sentence pairs, the tasks):
#   bash tools/replication/replicate_gpu.sh --prepare
# On the GPU machine, from the checkout's root, with .whl/ (tools/gpu/fetch_wheels.sh) and
# gpu_data/ carried, as many times as it takes (each call prints "left: N runs"):
#   bash tools/replication/replicate_gpu.sh
#
# Environment: OUT (where the results go: every results.json, metrics.jsonl, config.json and
# the reports, no checkpoints; default ./gpu_out), ROOT (the runs: gpu_runs/, git-ignored, so
# that it stays between the calls of a warm machine), BUDGET_S (540: the seconds from the
# call's start to its last line), MARGIN_S (100: kept after the runs' deadline for the one in
# flight to save, then the reports and the copy to OUT), LANES (8), SCALE (gpu), PYTHON
# (python3), DATA (gpu_data), STAGES.
#
# Plan (docs/replication.md: scale=gpu): 15 pretraining runs of 20,480 steps of 16 x 64 and 4
# runs pretrained once, then about 80 fine-tuning processes (4 tasks x 2 lrs x 2 seeds each,
# Table 5's ltr rows a span-QA run more); LANES of them share the GPU at a time, the host's
# cores doing the rest. A tiny model's step on a GPU is bound by dispatch, not by the device,
# so lanes add throughput until the host's cores run out.
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
PY="${PYTHON:-python3}"
DATA="${DATA:-gpu_data}"
ROOT="${ROOT:-$PWD/gpu_runs}"
OUT="${OUT:-$PWD/gpu_out}"
BUDGET_S="${BUDGET_S:-540}"
MARGIN_S="${MARGIN_S:-100}"
stamp() { echo "[$(($(date +%s) - START))s] $*"; }

if [[ "${1:-}" == "--prepare" ]]; then
  shift
  set -e
  PYTHON="$PY" bash tools/replication/build_data.sh \
    "${1:-../shared/data/corpus/pretrain_corpus.txt.gz}" "$DATA"
  PYTHON="$PY" bash tools/replication/build_tasks.sh "$DATA/tasks" "${2:-../shared/data/tasks}"
  du -sh "$DATA"
  exit 0
fi
[[ "${1:-}" == "--" ]] && shift

# The wheels a bare GPU image lacks, as tools/gpu/device_run.sh installs them ($WHEELS, default
# .whl; '' for none: the CPU test's Python 3.11, beside a checkout that fetched them).
WHEELS="${WHEELS-.whl}"
if [ -n "$WHEELS" ] && compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import bert_jax.configs" 2> /dev/null || ln -sfn ../configs bert_jax/configs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The lanes share one GPU: no process takes most of its memory up front; every program any
# process compiles is cached for the next (each fine-tuning run of a size compiles the same).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$ROOT/jax_cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
mkdir -p "$ROOT" "$OUT"
stamp "machine: $(nproc) cores; $("$PY" -c 'import jax; print(jax.devices()[0].device_kind)' 2>&1 | tail -1)"
if [[ ! -f "$DATA/corpus.txt" || ! -d "$DATA/tasks" ]]; then
  stamp "no $DATA/corpus.txt or $DATA/tasks: run 'bash tools/replication/replicate_gpu.sh --prepare' where ../shared is, and carry $DATA"
  exit 2
fi

SCALE="${SCALE:-gpu}" LANES="${LANES:-8}" DEADLINE=$((START + BUDGET_S - MARGIN_S)) \
  PYTHON="$PY" bash tools/replication/replicate.sh "$DATA/corpus.txt" "$DATA" "$ROOT" -- "$@"
rc=$?

# The results (small JSON and the reports; no checkpoints) to OUT.
(cd "$ROOT" && find . \( -name results.json -o -name metrics.jsonl -o -name config.json \
  -o -name sweep_done.json -o -name deadline.json -o -name '*.md' -o -name '*.png' \
  -o -name timeline.tsv \) -not -path '*/checkpoints/*' -not -path '*/seed_*/best/*' -print0 \
  | tar --null -cf - --files-from=- 2> /dev/null) | (mkdir -p "$OUT/replication" \
  && cd "$OUT/replication" && tar -xf -)
left=$(grep -c . "$ROOT/logs/queue_pretrain.txt" 2> /dev/null || echo 0)
done_=$(find "$ROOT" -name sweep_done.json 2> /dev/null | wc -l)
stamp "exit $rc; $done_ runs done of the queue's $left points and their fine-tuning; results in $OUT/replication"
[[ $rc == 0 ]] && stamp "done" || stamp "left: rerun the same command to go on"
exit 0
