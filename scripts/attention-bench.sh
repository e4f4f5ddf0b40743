#!/usr/bin/env bash
# Builds the attention_bench target in a configured CUDA build and runs it (our flash kernels and
# cuDNN's: correctness against a naive GPU reference, then TFLOP/s at T = 1k..128k), log in
# $OUT/attention-bench.log. On the GPU machine scripts/gpu-attention-check.sh calls it after the
# build (with the dependency and cuDNN library folders on LD_LIBRARY_PATH).
#   scripts/attention-bench.sh [--quick]    Environment: OUT (default /tmp/mt-out), MT_BUILD (the
#                                           build folder, default build-gpu, else build)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
b=${MT_BUILD:-}
[ -n "$b" ] || { [ -d build-gpu ] && b=build-gpu || b=build; }
[ -f "$b/CMakeCache.txt" ] || { echo "attention-bench: $b is not a configured build (scripts/build.sh $b)" >&2; exit 1; }
cmake --build "$b" --target attention_bench -j"$(nproc)" > "$OUT/attention-bench-build.log" 2>&1 ||
  { tail -30 "$OUT/attention-bench-build.log" >&2; exit 1; }
rm -f "$OUT/attention-bench-build.log"
"$b/attention_bench" "$@" 2>&1 | tee "$OUT/attention-bench.log"
