#!/usr/bin/env bash
# On the GPU machine: runs binaries built HERE (cmake -DMT_CUDA=ON; this machine's glibc is older
# than the GPU machine's, so they run there) and carried to it, without building there (which
# costs about 90 s of device time a call). Unpacks third_party/debs (carry it too) into /tmp/mtdeps
# for the Debian libraries the binaries link (OpenBLAS, cmocka, ...), puts them and the CUDA
# libraries on LD_LIBRARY_PATH, then runs the command given.
#   scripts/gpu-prebuilt.sh COMMAND [ARGS...]    e.g. scripts/gpu-prebuilt.sh build/test_cuda_ops
set -euo pipefail
cd "$(dirname "$0")/.."
deps=/tmp/mtdeps
if [ ! -d "$deps/usr" ]; then
  mkdir -p "$deps"
  for d in third_party/debs/*.deb; do
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$OLDPWD/$d" && tar -xf data.tar.* -C "$deps")
    rm -rf "$tmp"
  done
fi
multi=$(ls -d $deps/usr/lib/*-linux-gnu | head -1)
cuda=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp:$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
exec "$@"
