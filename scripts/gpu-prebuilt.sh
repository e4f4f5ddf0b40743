#!/usr/bin/env bash
# On the GPU machine: runs binaries built HERE (cmake -DMT_CUDA=ON; this machine's glibc is older
# than the GPU machine's, so they run there) and carried to it, without building there (which
# costs about 90 s of device time a call). Unpacks the .debs of MT_DEBS (default third_party/debs;
# carry it too) into /tmp/mtdeps for the Debian libraries the binaries link (OpenBLAS, cmocka, ...),
# puts them and the CUDA libraries on LD_LIBRARY_PATH, then runs the command given. The binaries
# must be built without MPI (-DMT_MPI=OFF: the GPU machine has no Open MPI), e.g.
#   scripts/build.sh build-dev -DMT_CUDA=ON -DMT_MPI=OFF
# MT_DEBS=third_party/debs-run (scripts/device-deps.sh --runtime) holds only the run-time libraries
# (8 MB instead of 15), which leaves more of the call's 64 MiB for binaries. Several test binaries
# pass that limit (6 MB each, mostly device code): strip them and carry one .tar.xz (6 binaries:
# 3 MB), unpacked there with python3's tarfile. Configure the build directory with
# third_party/cudnn-frontend present (scripts/cudnn-frontend.sh): without it the binaries have no
# cuDNN and attention runs on the built-in kernels (a git worktree lacks that ignored directory:
# session 14's binaries did).
#   scripts/gpu-prebuilt.sh COMMAND [ARGS...]    e.g. scripts/gpu-prebuilt.sh build/test_cuda_ops
set -euo pipefail
cd "$(dirname "$0")/.."
deps=/tmp/mtdeps
if [ ! -d "$deps/usr" ]; then
  mkdir -p "$deps"
  for d in "${MT_DEBS:-third_party/debs}"/*.deb; do
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$OLDPWD/$d" && tar -xf data.tar.* -C "$deps")
    rm -rf "$tmp"
  done
fi
multi=$(ls -d $deps/usr/lib/*-linux-gnu | head -1)
cuda=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp:$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
export MT_FIXTURES=${MT_FIXTURES:-$PWD/tests/fixtures} # the tests' compiled-in path is this machine's
exec "$@"
