#!/usr/bin/env bash
# The GPU comparison in one command, on a lent device machine or any GPU box whose python3 has
# jax (CUDA), flax, optax, orbax-checkpoint, torch and transformers (docs/gpu.md):
#   bash tools/gpu/fetch_wheels.sh      # once, where pip reaches PyPI: .whl/
#   bash tools/gpu/device_run.sh [benchmark flags, e.g. --variants=]
# Installs .whl/*.whl into /tmp/site, lets a bare checkout import bert_jax.configs as an install
# would, and runs `python -m bert_jax.benchmark --gpu`: the three shapes on both sides, the
# default variants that fit, the profile of our Base step (its trace under $OUT/profile). It
# writes gpu.jsonl, gpu.log, env.txt and losses.txt under $OUT (default ./gpu_out) and stays
# within 9 minutes: the benchmark plans for --deadline (475 s) and its parent stops its workers
# 45 s after it; `timeout` is the backstop.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# Without `pip install .`, configs/ is not yet the package bert_jax.configs (setup.py's
# package_dir): link it where an install puts it.
python3 -c "import bert_jax.configs" 2>/dev/null || ln -sfn ../configs bert_jax/configs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/env.txt" 2>&1
python3 -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|jax-cuda.*|flax|optax|orbax.*|torch|transformers|grain) " >>"$OUT/env.txt"
timeout 525 python3 -m bert_jax.benchmark --gpu --deadline=475 --json_out="$OUT/gpu.jsonl" \
  --profile_dir="$OUT/profile" "$@" 2>&1 | tee "$OUT/gpu.log"
# The first three losses of the Base 128 x 256 step against the CPU's (tools/gpu/cpu_losses.json).
python3 tools/gpu/cpu_reference.py --compare="$OUT/gpu.jsonl" 2>&1 | tee "$OUT/losses.txt"
