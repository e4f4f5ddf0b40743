#!/usr/bin/env bash
# Runs THERE, on the GPU machine (Ubuntu 24.04, nvcc, cmake, gcc, no apt), from the repo root:
# extracts third_party/debs/*.deb (made here by scripts/device-deps.sh) into /tmp/mtdeps, builds
# with the CUDA backend against that prefix, runs the GPU tests, then every CPU test, and leaves
# the logs in $OUT (at most 8 files).
#   scripts/gpu-test.sh [all|gpu|cpu|build]  (default all; `gpu` skips the CPU tests, `build` runs none)
# Environment: OUT (default /tmp/mt-gpu-out), MT_CTEST_JOBS (CPU tests in parallel, default 8),
# MT_DEPS (extraction folder, default /tmp/mtdeps), MT_BUILD (default build-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
OUT=${OUT:-/tmp/mt-gpu-out}
mkdir -p "$OUT"
log=$OUT/gpu-test.log
exec > >(tee -a "$log") 2>&1
echo "== gpu-test.sh $what  $(date -u +%FT%TZ)  $(uname -n)"

deps=${MT_DEPS:-/tmp/mtdeps}
build=${MT_BUILD:-build-gpu}
prefix=$deps/usr
shopt -s nullglob
debs=(third_party/debs/*.deb)
[ ${#debs[@]} -gt 0 ] || { echo "no third_party/debs/*.deb: run scripts/device-deps.sh here and carry third_party/debs"; exit 1; }
rm -rf "$deps"
mkdir -p "$deps"
for d in "${debs[@]}"; do
  if command -v dpkg >/dev/null; then
    dpkg -x "$d" "$deps"
  else # ar + tar: the data member may be .xz, .zst or .gz; tar picks the decompressor from a file
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$OLDPWD/$d" && tar -xf data.tar.* -C "$deps")
    rm -rf "$tmp"
  fi
done
echo "extracted ${#debs[@]} packages into $deps"

multi=$(ls -d "$prefix"/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DMT_CUDA=ON -DMT_DEPS_PREFIX="$prefix")
command -v pkg-config >/dev/null || cmake_args+=(-DPKG_CONFIG_EXECUTABLE="$prefix/bin/pkgconf")
echo "nvcc: $(command -v nvcc)  cmake: $(cmake --version | head -1)  gcc: $(gcc -dumpfullversion)"

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed (see nvidia-smi.txt)"
head -15 "$OUT/nvidia-smi.txt" || true

cmake -S . -B "$build" "${cmake_args[@]}" > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
grep -E "CUDA backend|dependency prefix|NCCL comm" "$OUT/configure.log" || true
t0=$(date +%s)
cmake --build "$build" -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E -A5 "error|Error" "$OUT/build.log" | head -80; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s; warnings: $(grep -c -i 'warning' "$OUT/build.log" || true)"
grep -E "cuDNN attention" "$OUT/configure.log" || true
[ "$what" = build ] && { echo "== gpu-test.sh build done"; exit 0; }

status=0
cd "$build"
if [ "$what" = all ] || [ "$what" = gpu ]; then
  echo "== GPU tests"
  ctest --output-on-failure -L gpu > "$OUT/ctest-gpu.log" 2>&1 || status=1
  grep -E "max_abs_err|bit-identical|DIFFERS|wrong|mismatches|budget child|FAIL|Passed|Failed|tests passed|Skipped" "$OUT/ctest-gpu.log" | tail -150 || true
fi
if [ "$what" = all ] || [ "$what" = cpu ]; then
  echo "== CPU tests (ctest -j${MT_CTEST_JOBS:-8})"
  ctest --output-on-failure -LE gpu -j"${MT_CTEST_JOBS:-8}" > "$OUT/ctest-cpu.log" 2>&1 || status=1
  tail -30 "$OUT/ctest-cpu.log"
fi
cp Testing/Temporary/LastTest.log "$OUT/LastTest.log" 2>/dev/null || true
echo "== gpu-test.sh done, status $status"
exit $status
