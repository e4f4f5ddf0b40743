#!/usr/bin/env bash
# On the GPU machine, from the repository root, with $OUT set (one device call):
# GPU tests (scripts/gpu-test.sh gpu), chat data trained on the GPU (scripts/gpu-chat-check.sh),
# the attention kernel's own check and speed, a compute-sanitizer memcheck of a short training run,
# then bench/gpu_bench.sh for the shapes given.
#   scripts/gpu-check.sh [shapes...]     e.g. 1.5b   (none: no benchmark)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/check.log
OUT=/tmp/gt bash scripts/gpu-test.sh gpu > /dev/null 2>&1
cat /tmp/gt/gpu-test.log /tmp/gt/ctest-gpu.log > "$OUT/gpu-tests.log" 2>/dev/null
tail -3 /tmp/gt/gpu-test.log > "$log"
multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH=/usr/local/cuda/bin:$PATH
echo "== chat data on the GPU (scripts/gpu-chat-check.sh)" >> "$log"
OUT=$OUT MT_BIN=build-gpu/megatrain bash scripts/gpu-chat-check.sh > /dev/null 2>&1
tail -8 "$OUT/chat-check.log" >> "$log" 2>/dev/null
[ -n "${SKIP_EXTRA:-}" ] || {
  echo "== attention kernel: correctness vs a naive GPU reference, then speed"
  cmake --build build-gpu --target attention_bench > /dev/null && build-gpu/attention_bench
  echo "== compute-sanitizer memcheck: 3 training steps of a small model on the GPU"
  python3 bench/make_tokens.py 320 20000 /tmp/small.bin
  compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 \
    build-gpu/megatrain train --init configs/tiny-bytes.json --data /tmp/small.bin --out /tmp/cs \
    --steps 3 --batch 4 --micro-batch 2 --seq 128 --device cuda --no-save 2>&1 | tail -12
  echo "memcheck exit status: ${PIPESTATUS[0]}"
} >> "$log" 2>&1
[ $# -gt 0 ] && MT_BIN=build-gpu/megatrain bash bench/gpu_bench.sh "$@" > /dev/null 2>&1
exit 0
