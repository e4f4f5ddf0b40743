#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one device call (carry third_party/debs and
# third_party/cudnn-frontend): the Gated DeltaNet's CUDA ops against the CPU and their timing
# (scripts/gpu-deltanet-check.sh, which builds build-gpu/), then test_cuda_model's qwen3_5 whole
# models (CUDA against the CPU: logits, loss, every gradient) and test_cuda_ops. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
if [ -n "${SKIP_DELTANET:-}" ]; then # the build alone (SKIP_DELTANET=1: the ops' check ran already)
  log=$OUT/qwen35-check.log; say() { echo "$*" | tee -a "$log"; }
  . scripts/gpu-build-step.sh
  gpu_build_step qwen35
  status=0
else
  MT_CHECK_BUDGET_S=${MT_CHECK_BUDGET_S:-330} bash scripts/gpu-deltanet-check.sh
  status=$?
fi
multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=16
log=$OUT/qwen35-check.log
echo "== test_cuda_model (qwen3_5 models only)" | tee -a "$log"
MT_TEST_FILTER='test_qwen3_5*' timeout 150 build-gpu/test_cuda_model > "$OUT/qwen35-model.log" 2>&1
echo "test_cuda_model rc=$?" | tee -a "$log"
grep -E "^---|logits|loss  |OK \]|FAILED|PASSED|ERROR" "$OUT/qwen35-model.log" | head -40; grep -c FAIL "$OUT/qwen35-model.log" | tee -a "$log"
exit $status
