#!/usr/bin/env bash
# The GPU comparison in one command, on a lent device machine or any GPU box whose python3 has
# jax (CUDA), flax, optax, orbax-checkpoint, torch and transformers (docs/gpu.md):
#   bash tools/gpu/fetch_wheels.sh      # once, where pip reaches PyPI: .whl/
#   bash tools/gpu/device_run.sh [benchmark flags, e.g. --variants=]
#   bash tools/gpu/device_run.sh --tune [tune_kernels flags]   # tools/gpu/tune_kernels.py
# Installs .whl/*.whl into /tmp/site, lets a bare checkout import bert_jax.configs as an install
# would, and runs `python -m bert_jax.benchmark --gpu`: each side's cold build of Large 128 x 256
# alone, then the three shapes on both sides, the bf16 matmul on both sides, the profiles of our
# default step and torch.compile's at Base 128 and Large 512, the variants that fit. Every build
# is cold: no persistent JAX cache (a later --compilation_cache_dir=DIR wins), fresh Inductor and
# Triton caches. It writes at most 8 files under $OUT (default ./gpu_out), none deeper than
# $OUT/profile/: gpu.jsonl, gpu.log, env.txt, losses.txt and profile/{ours,torch}-*.trace.json.gz.
# It stays within 9 minutes: the benchmark plans for --deadline (500 s) and its parent stops its
# workers 20 s after it; `timeout` is the backstop. $PYTHON (default python3) runs it all; the
# CPU test (tests/lab/test_benchmark_gpu.py) runs it with --gpu_smoke and WHEELS=''.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu_out}"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS-.whl}"  # the wheels to install first ('' for none: the CPU test's Python 3.11)
mkdir -p "$OUT"
if [ -n "$WHEELS" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# Without `pip install .`, configs/ is not yet the package bert_jax.configs (setup.py's
# package_dir): link it where an install puts it.
"$PYTHON" -c "import bert_jax.configs" 2>/dev/null || ln -sfn ../configs bert_jax/configs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
SCRATCH="$(mktemp -d)"
export TORCHINDUCTOR_CACHE_DIR="$SCRATCH/inductor" TRITON_CACHE_DIR="$SCRATCH/triton"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PYTHON" -m pip list 2>/dev/null |
    grep -i -E "^(jax|jaxlib|jax-cuda.*|flax|optax|orbax.*|torch|transformers|grain) "
} >"$OUT/env.txt"
if [[ "${1:-}" == "--tune" ]]; then  # the kernel-level measurements: $OUT/tune.{jsonl,log}
  shift
  timeout 300 "$PYTHON" tools/gpu/tune_kernels.py --out="$OUT" "$@" 2>&1 | tee "$OUT/tune.log"
  status=${PIPESTATUS[0]}
  rm -rf "$SCRATCH"
  exit "$status"
fi
timeout 525 "$PYTHON" -m bert_jax.benchmark --gpu --deadline=500 --compilation_cache_dir=none \
  --json_out="$OUT/gpu.jsonl" --profile_dir="$OUT/profile" "$@" 2>&1 | tee "$OUT/gpu.log"
status=$?
# The first three losses of our Base 128 x 256 step (the variant with the CPU reference's
# dropout bits) against the CPU's (tools/gpu/cpu_losses.json).
"$PYTHON" tools/gpu/cpu_reference.py --compare="$OUT/gpu.jsonl" 2>&1 | tee "$OUT/losses.txt"
rm -rf "$SCRATCH"
exit "$status"  # the benchmark's (a failed loss comparison says so in losses.txt)
