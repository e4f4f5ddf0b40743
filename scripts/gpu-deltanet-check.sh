#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one device call: builds build-gpu/
# (scripts/gpu-test.sh build: carry third_party/debs and third_party/cudnn-frontend), runs
# tests/gpu/test_cuda_gated_delta (the Gated DeltaNet's CUDA ops against the CPU backend), then its
# timing mode (--bench: the chunked gated delta rule, forward + backward, at the Qwen3.6-35B-A3B
# layer shape for T = 4096, 32768, 131072) while time is left. Logs in $OUT: deltanet-check.log
# (the summary), gpu-test.log (the build), deltanet-test.log, deltanet-bench.log.
#   scripts/gpu-deltanet-check.sh    Environment: OUT (default /tmp/mt-out), MT_CHECK_BUDGET_S
#                                    (seconds after which the bench is skipped, 400)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/deltanet-check.log
start=$(date +%s)
say() { echo "$*" | tee -a "$log"; }
: > "$log"
say "== gpu-deltanet-check.sh $(date -u +%FT%TZ) $(uname -n)"
export PATH=/usr/local/cuda/bin:$PATH

. scripts/gpu-build-step.sh
gpu_build_step deltanet
b=build-gpu
status=0
el() { echo $(( $(date +%s) - start )); }

left=$(( 540 - $(el) )); [ $left -gt 180 ] && left=180
say "== test_cuda_gated_delta (timeout $left s)  [$(el) s]"
timeout $left "$b/test_cuda_gated_delta" > "$OUT/deltanet-test.log" 2>&1 ||
  { status=1; tail -5 "$OUT/deltanet-test.log" | tee -a "$log"; }
grep -E "FAIL|DIFFERS|megatrain:|PASSED|FAILED|OK \]|ERROR" "$OUT/deltanet-test.log" | tail -40 | tee -a "$log"

if [ "$(el)" -lt "${MT_CHECK_BUDGET_S:-400}" ]; then
  say "== test_cuda_gated_delta --bench  [$(el) s]"
  timeout $(( 560 - $(el) )) "$b/test_cuda_gated_delta" --bench > "$OUT/deltanet-bench.log" 2>&1 ||
    status=1
  grep -E "gated_delta|T=|megatrain:|FAIL" "$OUT/deltanet-bench.log" | tee -a "$log"
else
  say "== bench skipped: $(el) s spent (MT_CHECK_BUDGET_S=${MT_CHECK_BUDGET_S:-400})"
fi
say "== gpu-deltanet-check.sh done in $(el) s, status $status"
exit $status
