#!/usr/bin/env bash
# Configures and builds into DIR (default build/) with any extra cmake arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
# the cuDNN frontend's headers where nvcc can build the CUDA backend (without them the build goes
# on, with the cuDNN attention left out: CMake says so)
if [[ " $* " != *" -DMT_CUDA=OFF "* ]] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  scripts/cudnn-frontend.sh || echo "build.sh: no cuDNN frontend headers; building without the cuDNN attention" >&2
fi
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)" 2>&1 | grep -v -E '^\[ *[0-9]+%\]' || true
test -x "$dir/megatrain"
