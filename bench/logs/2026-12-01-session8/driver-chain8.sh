#!/usr/bin/env bash
# session 8 calls 1-2: detached (setsid) so it outlives call 1; call 2 collects it. Logs in /tmp/c8.
# Order = priority: build, the GPU suite with cuDNN required, moe_bench (loop vs grouped expert
# GEMMs), the Qwen3-30B-A3B shape --state tight with MT_MOE_GEMM=grouped (only if test_cuda_moe
# passed), the 7B full setup with MT_PIN=register then alloc (2 steps each).
set -uo pipefail
cd "$1"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=/tmp/c8
say() { echo "$(date -u +%T) $*" >> $L/chain.log; }
say "chain start"
OUT=$L/gt bash scripts/gpu-test.sh build > $L/build-driver.log 2>&1; rc=$?; say "build rc $rc"
[ $rc -eq 0 ] || { tail -40 $L/gt/build.log >> $L/chain.log; say "chain done"; exit 1; }
multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp:$LD_LIBRARY_PATH"
(cd build-gpu && MT_REQUIRE_CUDNN=1 ctest --output-on-failure -L gpu > $L/tests.log 2>&1; say "gpu tests rc $?")
grep -E "Test +#|tests passed" $L/tests.log >> $L/chain.log
say "moe_bench"; OUT=$L/mb OMP_NUM_THREADS=16 MT_BUILD=build-gpu timeout 260 bash scripts/moe-bench.sh > /dev/null 2>&1; say "moe_bench rc $?"
grep -E "^moe_bench|^probe|^==|total|forward \+ backward|all expert GEMMs|FAIL|megatrain:" $L/mb/moe-bench.log >> $L/chain.log
if grep -qE "test_cuda_moe .*Passed" $L/tests.log; then
  say "moe30b tight grouped"; STEPS=3 OUT=$L/st MT_MOE_GEMM=grouped FLAGS_moe30b="--state tight" bash scripts/gpu-state-check.sh moe30b > /dev/null 2>&1
  grep -E "^RESULT|Maximum resident|^step |^gpu tier|^step time|failed" $L/st/state.log | tail -12 >> $L/chain.log
fi
[ -f /tmp/state_tokens_152064.bin ] || python3 bench/make_tokens.py 152064 $(( 4 * 16 * 4096 + 1 )) /tmp/state_tokens_152064.bin
for pin in register alloc; do
  say "7b full MT_PIN=$pin"
  MT_PIN=$pin timeout 200 build-gpu/megatrain train --init bench/configs/qwen2.5-7b.json --data /tmp/state_tokens_152064.bin \
    --out /tmp/pin-run --overwrite --steps 2 --batch 16 --seq 4096 --no-shuffle --device cuda --no-save --warmup 1 --state full > $L/pin-$pin.out 2>&1
  say "rc $?"; grep -E "^set up|^step |megatrain:" $L/pin-$pin.out >> $L/chain.log
done
say "chain done"
