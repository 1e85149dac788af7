#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the CPython 3.12 x86-64 wheels that a GPU box's Python lacks
# for `python -m bert_jax.benchmark --gpu`: the lent device machine's image has jax, flax, optax,
# orbax-checkpoint, torch and transformers but not these (docs/gpu.md). --no-deps: their own
# needs (absl-py, etils, cloudpickle, protobuf, numpy, PyYAML, packaging, psutil) are there.
#   bash tools/gpu/fetch_wheels.sh    # from the checkout's root; about 4 MB
set -euo pipefail
cd "$(dirname "$0")/../.."
PIP="${PIP:-python3 -m pip}"
WHEELS=(
  grain==0.2.18
  array_record==0.8.6
  ml_collections==1.1.0
  tensorboardX==2.6.5
  portpicker==1.6.0
  importlib_resources==7.1.0
)
rm -rf .whl && mkdir -p .whl
# pip matches each manylinux tag exactly: list the ones these projects publish.
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -1 .whl
