#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one device call (about 5 minutes on an H200):
# cuDNN's flash attention against the CPU reference and our kernels (tests/gpu/test_cuda_attention.c),
# the speed of both (bench/attention_bench.cu), then the other GPU tests while time is left (their
# attention runs cuDNN's forward by the auto rule). Needs third_party/debs (scripts/device-deps.sh)
# and third_party/cudnn-frontend (scripts/cudnn-frontend.sh) carried along; cuDNN itself is the
# machine's (CUDA's folders or a Python wheel, e.g. PyTorch's nvidia-cudnn-cu13), found below.
# Logs in $OUT: attention-check.log (the summary), gpu-test.log (the build), attention-test.log,
# attention-bench.log, gpu-tests.log.
#   scripts/gpu-attention-check.sh      Environment: OUT (default /tmp/mt-out), MT_CHECK_BUDGET_S
#                                        (seconds after which the other GPU tests are skipped, 270)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/attention-check.log
start=$(date +%s)
say() { echo "$*" | tee -a "$log"; }
: > "$log"
say "== gpu-attention-check.sh $(date -u +%FT%TZ) $(uname -n)"
export PATH=/usr/local/cuda/bin:$PATH

# cuDNN: the first libcudnn.so.9 in CUDA's folders, the system's, or a Python wheel's
lib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  [ -e "$d/libcudnn.so.9" ] && { lib=$d; break; }
done
if [ -z "$lib" ]; then
  f=$(find /opt /usr/local/lib /usr/lib/python3* /root/.local -name 'libcudnn.so.9' 2>/dev/null | head -1)
  [ -n "$f" ] && lib=$(dirname "$f")
fi
if [ -n "$lib" ]; then
  say "cuDNN library: $lib ($(ls "$lib"/libcudnn.so.9* | head -3 | xargs -n1 basename | tr '\n' ' '))"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # the headers beside it, when it has them; else CMake takes the copy in third_party/cudnn-frontend
  for inc in "$lib/../include" "$(dirname "$lib")/include"; do
    [ -f "$inc/cudnn.h" ] && { export CUDNN_INCLUDE_DIR=$(cd "$inc" && pwd); break; }
  done
else
  say "no libcudnn.so.9 found: the cuDNN cases will fail (MT_REQUIRE_CUDNN=1)"
fi
# cuDNN's runtime-compiled engines load NVRTC
nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | head -1)
[ -n "$nvrtc" ] || nvrtc=$(find /opt /usr/local/lib -name 'libnvrtc.so.1*' 2>/dev/null | head -1)
[ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$(dirname "$nvrtc"):$LD_LIBRARY_PATH"
say "cudnn.h: ${CUDNN_INCLUDE_DIR:-(the copy in third_party/cudnn-frontend/cudnn/include)}"
[ -f third_party/cudnn-frontend/include/cudnn_frontend.h ] ||
  say "no third_party/cudnn-frontend/include: run scripts/cudnn-frontend.sh here and carry third_party/cudnn-frontend"

. scripts/gpu-build-step.sh
gpu_build_step att
b=build-gpu
status=0

say "== test_cuda_attention (MT_REQUIRE_CUDNN=1)  [$(( $(date +%s) - start )) s]"
MT_REQUIRE_CUDNN=1 CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGDEST_DBG=stderr timeout 150 "$b/test_cuda_attention" \
  > "$OUT/attention-test.log" 2>&1 || { status=1; tail -5 "$OUT/attention-test.log" | tee -a "$log"; }
grep -E "cuDNN|ran |FAIL|PASSED|FAILED|megatrain:" "$OUT/attention-test.log" | tail -40 | tee -a "$log"

say "== attention_bench (scripts/attention-bench.sh)  [$(( $(date +%s) - start )) s]"
OUT=$OUT MT_BUILD=$b timeout 150 bash scripts/attention-bench.sh > /dev/null 2>&1 ||
  { status=1; tail -5 "$OUT/attention-bench.log" | tee -a "$log"; }
grep -E "cuDNN|FAIL|PASSED|failure|TFLOP|cudnn vs own|cudnn workspace|auto runs|megatrain:" "$OUT/attention-bench.log" | tee -a "$log"

budget=${MT_CHECK_BUDGET_S:-270}
if [ $(( $(date +%s) - start )) -lt "$budget" ]; then
  say "== the other GPU tests (ctest -L gpu -E test_cuda_attention)  [$(( $(date +%s) - start )) s]"
  (cd "$b" && timeout $(( 345 - ($(date +%s) - start) )) ctest --output-on-failure -L gpu \
    -E test_cuda_attention) > "$OUT/gpu-tests.log" 2>&1 || status=1
  grep -E "attn_|tests passed|Failed|FAIL|Passed|Skipped" "$OUT/gpu-tests.log" | tail -40 | tee -a "$log"
else
  say "== the other GPU tests skipped: $(( $(date +%s) - start )) s spent (MT_CHECK_BUDGET_S=$budget)"
fi
say "== gpu-attention-check.sh done in $(( $(date +%s) - start )) s, status $status"
exit $status
