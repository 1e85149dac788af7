#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM slice (single- or multi-host) with gcloud.
#
#   export TPU_NAME=bert-v5e16 ZONE=us-west4-a ACCELERATOR=v5litepod-16 \
#          RUNTIME=v2-alpha-tpuv5-lite PROJECT=my-project
#   launch/tpu_pod.sh create                  # the slice (on-demand Create Node API)
#   launch/tpu_pod.sh setup                   # copy this checkout, pip install -e .[tpu]
#   launch/tpu_pod.sh run --config=configs/bert_base.py --workdir=/mnt/shared/bert_base \
#       --config.data.dir=/mnt/shared/wiki_books_128 --config.mesh.shape='(1,16,1)'
#   launch/tpu_pod.sh ssh                     # a shell on worker 0
#   launch/tpu_pod.sh delete
#
# Check the config fits first, from any CPU machine:
#   python -m bert_jax.aot --config=configs/bert_base.py --topology=v5e-16
#
# `run` starts `python -m bert_jax.main --distributed ...` on every worker at once
# (`gcloud compute tpus tpu-vm ssh --worker=all --command=...`); jax.distributed.initialize()
# finds the coordinator, process count and ids from the TPU metadata by itself. The workdir
# and the data must be storage every worker sees at the same path (a gcsfuse mount of a bucket
# or a Filestore NFS share): orbax writes checkpoints from all hosts, metrics from host 0.
#
# ACCELERATOR / RUNTIME pairs (Cloud TPU docs, "TPU software versions"):
#   v4-8 ... v4-N           tpu-ubuntu2204-base
#   v5litepod-4 ... -256    v2-alpha-tpuv5-lite      (16 GiB HBM per chip)
#   v5p-8 ... v5p-N         v2-alpha-tpuv5
#   v6e-8 ... v6e-256       v2-alpha-tpuv6e
# Multislice (several slices over DCN) needs queued resources (`gcloud compute tpus
# queued-resources create ... --node-count=N`); not scripted here.
#
# Not run: written from the gcloud reference (gcloud compute tpus tpu-vm create/scp/ssh/delete);
# no TPU was available when writing it.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
ACCELERATOR="${ACCELERATOR:-v5litepod-16}"
RUNTIME="${RUNTIME:-v2-alpha-tpuv5-lite}"
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="$PROJECT"); fi
REMOTE_DIR="${REMOTE_DIR:-bert_jax}"  # relative to each worker's home directory

tpu() { gcloud compute tpus tpu-vm "$@" --zone="$ZONE" "${PROJECT_FLAG[@]}"; }
on_all() { tpu ssh "$TPU_NAME" --worker=all --command="$1"; }

cmd="${1:-}"
shift || true
case "$cmd" in
  create)
    tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR" --version="$RUNTIME"
    ;;
  setup)
    # The committed tree only (no venvs, workdirs or data), identical on every worker. The
    # TPU images run Ubuntu 22.04 (Python 3.10); uv provides the Python 3.11 bert_jax needs.
    archive="$(mktemp -d)/bert_jax.tar.gz"
    git -C "$(dirname "$0")/.." archive --format=tar.gz -o "$archive" HEAD
    tpu scp "$archive" "$TPU_NAME":bert_jax.tar.gz --worker=all
    on_all "set -e; rm -rf $REMOTE_DIR && mkdir -p $REMOTE_DIR \
      && tar -xzf bert_jax.tar.gz -C $REMOTE_DIR \
      && python3 -m pip install -q --user uv \
      && ~/.local/bin/uv venv -q --python 3.11 ~/venv \
      && ~/.local/bin/uv pip install -q --python ~/venv/bin/python -e '$REMOTE_DIR[tpu]' \
      && ~/venv/bin/python -c 'import jax; print(jax.process_index(), jax.device_count())'"
    ;;
  run)
    (($#)) || { echo "usage: $0 run --config=... --workdir=... [--config.x=y ...]" >&2; exit 2; }
    args=""
    for a in "$@"; do args+=" $(printf '%q' "$a")"; done
    # Foreground on every worker: Ctrl-C stops the ssh sessions (and the training with them).
    on_all "cd $REMOTE_DIR && ~/venv/bin/python -m bert_jax.main --distributed$args"
    ;;
  ssh)
    tpu ssh "$TPU_NAME" --worker=0
    ;;
  delete)
    tpu delete "$TPU_NAME" --quiet
    ;;
  *)
    echo "usage: $0 create|setup|run|ssh|delete  (see the header of $0)" >&2
    exit 2
    ;;
esac
