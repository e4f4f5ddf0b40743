#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one device call (issue 14): builds build-gpu/
# (scripts/gpu-test.sh build: carry third_party/debs and third_party/cudnn-frontend), runs
# bench/moe_bench.cu with the experts' GEMMs as the per-expert loop (MT_MOE_GEMM=loop; its second
# half compares loop and grouped product by product), tests/gpu/test_cuda_moe (test_expert_gemms:
# MT_MOE_GEMM=grouped against the loop), then moe_bench with MT_MOE_GEMM=grouped (the pieces in
# grouped mode, fewer iterations) while time is left. Logs in $OUT: moe-check.log (the
# summary), gpu-test.log (the build), moe-test.log, moe-bench.log, moe-bench-grouped.log.
#   scripts/gpu-moe-check.sh      Environment: OUT (default /tmp/mt-out), MT_CHECK_BUDGET_S
#                                 (seconds after which the grouped bench run is skipped, 420)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/moe-check.log
start=$(date +%s)
say() { echo "$*" | tee -a "$log"; }
: > "$log"
say "== gpu-moe-check.sh $(date -u +%FT%TZ) $(uname -n)"
export PATH=/usr/local/cuda/bin:$PATH

. scripts/gpu-build-step.sh
gpu_build_step moe
b=build-gpu
status=0
el() { echo $(( $(date +%s) - start )); }

say "== moe_bench, MT_MOE_GEMM=loop (scripts/moe-bench.sh)  [$(el) s]"
OUT=$OUT MT_BUILD=$b MT_MOE_GEMM=loop timeout 240 bash scripts/moe-bench.sh > /dev/null 2>&1 || status=1
grep -E "^moe_bench|^probe|^==|total|forward \+ backward|mt_moe_|all expert GEMMs|FAIL|megatrain:" \
  "$OUT/moe-bench.log" | tee -a "$log"

left=$(( 540 - $(el) )); [ $left -gt 200 ] && left=200
if [ $left -ge 30 ]; then
  say "== test_cuda_moe (timeout $left s)  [$(el) s]"
  timeout $left "$b/test_cuda_moe" > "$OUT/moe-test.log" 2>&1 ||
    { status=1; tail -5 "$OUT/moe-test.log" | tee -a "$log"; }
  grep -E "grouped vs|megatrain:|FAIL|PASSED|FAILED|OK \]" "$OUT/moe-test.log" | tail -30 | tee -a "$log"
else
  say "== test_cuda_moe skipped: $(el) s spent"
fi

if [ "$(el)" -lt "${MT_CHECK_BUDGET_S:-420}" ]; then
  say "== moe_bench, MT_MOE_GEMM=grouped --iters 3  [$(el) s]"
  MT_MOE_GEMM=grouped timeout $(( 560 - $(el) )) "$b/moe_bench" --iters 3 > "$OUT/moe-bench-grouped.log" 2>&1 ||
    status=1
  grep -E "^==|total|forward \+ backward|FAIL|megatrain:" "$OUT/moe-bench-grouped.log" | tee -a "$log"
else
  say "== moe_bench grouped skipped: $(el) s spent (MT_CHECK_BUDGET_S=${MT_CHECK_BUDGET_S:-420})"
fi
say "== gpu-moe-check.sh done in $(el) s, status $status"
exit $status
