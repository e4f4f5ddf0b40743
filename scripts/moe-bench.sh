#!/usr/bin/env bash
# Builds the moe_bench target in a configured CUDA build and runs it from the repository root (the
# MoE block's GPU time piece by piece through the CUDA backend, then the experts' GEMMs as a
# per-expert loop against one cublasGemmGroupedBatchedEx call, with the checks of grouped against
# loop), log in $OUT/moe-bench.log. Exit status: the bench's (1 when a check fails).
#   scripts/moe-bench.sh [--iters N] [--only qwen3|mixtral] [--quick]
#   Environment: OUT (default /tmp/mt-out), MT_BUILD (the build folder: default build-gpu,
#   else build)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
b=${MT_BUILD:-}
[ -n "$b" ] || { [ -d build-gpu ] && b=build-gpu || b=build; }
[ -f "$b/CMakeCache.txt" ] ||
  { echo "moe-bench: $b is not a configured build (scripts/build.sh $b)" >&2; exit 1; }
cmake --build "$b" --target moe_bench -j"$(nproc)" > "$OUT/moe-bench-build.log" 2>&1 ||
  { tail -30 "$OUT/moe-bench-build.log" >&2; exit 1; }
rm -f "$OUT/moe-bench-build.log"
"$b/moe_bench" "$@" 2>&1 | tee "$OUT/moe-bench.log"
exit "${PIPESTATUS[0]}"
