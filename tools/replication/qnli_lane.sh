#!/usr/bin/env bash
# The QNLI lane (docs/replication.md, "The QNLI lane"): Table 5's MLM + NSP and MLM-only points,
# 3 pretraining seeds each, and the no-pretraining control beside the baseline, pretrained on
# the corpus's prose (its first 2,688 documents: the 18 Gutenberg books, the State of the Union
# addresses, the Hansard sample; 5.7M tokens with their own 4,096-entry vocab) for STEPS
# steps of BATCH x 64, fine-tuned on squad_qnli (QNLI's stand-in) alone, and judged by the
# replication's test (bert_jax/report/stats.py). Everything else is the cpu recipe
# (config_lib.scaled_base).
#
#   bash tools/replication/qnli_lane.sh --prepare [CORPUS [TASK_ROOT]]  # DATA: corpus, vocab, tasks
#   bash tools/replication/qnli_lane.sh [-- SWEEP_FLAGS...]             # here, 2 lanes, into ROOT
#   GPU=1 EVAL_EXAMPLES=0 bash tools/replication/qnli_lane.sh           # on a GPU machine
#
# Environment: DATA (lane_data), ROOT (lane_runs; with GPU=1 replicate_gpu.sh's gpu_runs),
# BATCH (16; with GPU=1 64: 4 times the tokens in the same steps, from 8 passes of pairs, on
# the expectation, not yet measured, that a tiny model's step on a GPU is bound by dispatch at
# either size), STEPS (36000, or a multiple: the passes of pairs grow with it),
# EVAL_EXAMPLES (1000: the dev and test pairs each fine-tuning run scores; 0: all of them),
# GPU, PYTHON, and those of replicate.sh / replicate_gpu.sh (LANES, BUDGET_S, OUT, ...).
# The lane at twice the tokens (docs/replication.md):
#   STEPS=72000 EVAL_EXAMPLES=0 bash tools/replication/qnli_lane.sh
#
# --prepare leaves out the sentence pairs (DATA/nsp, 35 MB): they are rebuilt where the lane
# runs, in seconds, to the same bytes (create_data is deterministic), so that DATA (corpus,
# vocab and tasks: 37 MB) travels to a GPU machine with .whl under the 64 MiB it carries.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA="${DATA:-lane_data}"
STEPS="${STEPS:-36000}"
BATCH="${BATCH:-$([[ -n ${GPU:-} ]] && echo 64 || echo 16)}"
if ! [[ $BATCH =~ ^[1-9][0-9]*$ ]] || ((BATCH % 8)); then
  echo "qnli_lane.sh: error: BATCH=$BATCH: a positive multiple of 8 (16 here, 64 on a GPU)" >&2
  exit 2
fi
if ! [[ $STEPS =~ ^[1-9][0-9]*$ ]] || ((STEPS % 36000)); then
  echo "qnli_lane.sh: error: STEPS=$STEPS: a positive multiple of 36000" >&2
  exit 2
fi
EVAL_EXAMPLES="${EVAL_EXAMPLES:-1000}"
if ! [[ $EVAL_EXAMPLES =~ ^[0-9]+$ ]]; then
  echo "qnli_lane.sh: error: EVAL_EXAMPLES=$EVAL_EXAMPLES: a count (0: every dev and test pair)" >&2
  exit 2
fi
# Passes of pairs with their own masks: each static mask comes back about 3 times in a point's
# STEPS x BATCH x 64 tokens at any BATCH and STEPS (2 passes at 16 x 36,000).
export DOCS="${DOCS:-2688}" DUPE=$((2 * BATCH / 16 * STEPS / 36000)) EVAL_FRACTION=0.02
flags=(--config.opt.total_steps=$STEPS --config.opt.warmup_steps=$((STEPS / 20))
  --config.ckpt.every_steps=$((STEPS / 4)) --config.eval.every_steps=$((STEPS / 6))
  --config.log.every_steps=$((STEPS / 60)))
[[ $BATCH == 16 ]] || flags+=(--config.data.batch_size="$BATCH")
# The fine-tuning runs score the first EVAL_EXAMPLES dev and test pairs (the cpu suite's 1,000;
# 0: all 5,006 and 5,838).
[[ $EVAL_EXAMPLES == 1000 ]] || flags+=(--finetune.task.max_eval_examples="$EVAL_EXAMPLES")
export QUEUE_FILTER='^table5 task=(mlm_nsp|mlm),seed=[012]$' TASKS=squad_qnli

if [[ "${1:-}" == "--prepare" ]]; then
  shift
  PY="${PYTHON:-python}"
  PYTHON="$PY" bash tools/replication/build_data.sh \
    "${1:-../shared/data/corpus/pretrain_corpus.txt.gz}" "$DATA"
  PYTHON="$PY" bash tools/replication/build_tasks.sh "$DATA/tasks" "${2:-../shared/data/tasks}"
  rm -rf "$DATA/nsp"
  du -sh "$DATA"
  exit 0
fi
[[ "${1:-}" == "--" ]] && shift
if [[ -n ${GPU:-} ]]; then
  DATA="$DATA" exec bash tools/replication/replicate_gpu.sh -- "${flags[@]}" "$@"
fi
SCALE=cpu LANES="${LANES:-2}" exec bash tools/replication/replicate.sh "$DATA/corpus.txt" "$DATA" \
  "${ROOT:-$PWD/lane_runs}" -- "${flags[@]}" "$@"
