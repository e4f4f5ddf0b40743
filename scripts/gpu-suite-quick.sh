#!/usr/bin/env bash
# On the GPU machine, one device call (carry third_party/debs and third_party/cudnn-frontend): the
# build and every GPU test but test_cuda_model (the long one, ~4 minutes; run it with
# scripts/gpu-test.sh gpu). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/suite-quick.log
say() { echo "$*" | tee -a "$log"; }
: > "$log"
export PATH=/usr/local/cuda/bin:$PATH
. scripts/gpu-build-step.sh
gpu_build_step quick
(cd build-gpu && timeout 200 ctest -L gpu -E test_cuda_model --output-on-failure) > "$OUT/suite-quick-ctest.log" 2>&1
say "ctest rc=$?"
grep -E "Test #|tests passed|FAILED" "$OUT/suite-quick-ctest.log" | tee -a "$log"
