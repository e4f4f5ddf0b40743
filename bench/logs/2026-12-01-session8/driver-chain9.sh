#!/usr/bin/env bash
# session 8 calls 3-4: detached. build, the GPU suite with cuDNN required (the docs test's new bound,
# MT_MOE_GEMM=auto the default), moe_bench --iters 3 (auto), Qwen3-30B-A3B --state compact (auto:
# micro-batch 1 in 2048-token chunks = 128 rows an expert, grouped; the plan says ~10.2 s a step,
# 7.73 s compute; --trace for bench/trace_summary.py). Logs in /tmp/c9.
set -uo pipefail
cd "$1"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=/tmp/c9
say() { echo "$(date -u +%T) $*" >> $L/chain.log; }
say "chain start"
OUT=$L/gt bash scripts/gpu-test.sh build > $L/build-driver.log 2>&1; rc=$?; say "build rc $rc"
[ $rc -eq 0 ] || { tail -40 $L/gt/build.log >> $L/chain.log; say "chain done"; exit 1; }
multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp:$LD_LIBRARY_PATH"
(cd build-gpu && MT_REQUIRE_CUDNN=1 ctest --output-on-failure -L gpu > $L/tests.log 2>&1; say "gpu tests rc $?")
grep -E "Test +#|tests passed" $L/tests.log >> $L/chain.log
grep -E "^step +[0-9]+: loss cudnn|auto at|grouped vs loop|FAIL" $L/tests.log >> $L/chain.log
say "moe_bench auto"; OMP_NUM_THREADS=16 timeout 120 build-gpu/moe_bench --iters 3 --only qwen3 > $L/moe-bench-auto.log 2>&1; say "moe_bench rc $?"
grep -E "^==|piece \(|total|forward \+ backward|FAIL|megatrain:" $L/moe-bench-auto.log >> $L/chain.log
if grep -qE "test_cuda_moe .*Passed" $L/tests.log; then
  say "moe30b compact auto"; STEPS=3 OUT=$L/st FLAGS_moe30b="--trace $L/moe30b-compact-trace.json" bash scripts/gpu-state-check.sh moe30b > /dev/null 2>&1
  grep -E "^RESULT|Maximum resident|^step |^micro|^gpu tier|^step time|failed" $L/st/state.log | tail -12 >> $L/chain.log
  cp $L/st/state-moe30b-compact.out $L/compact-auto.out # (the tight run below writes the same name)
fi
if grep -qE "test_cuda_moe .*Passed" $L/tests.log; then
  # tight again with the 16384-slot plan cache (session 7: 7.9-12.9 s a step; session 8 grouped: 7.8-8.7)
  say "moe30b tight"; STEPS=3 OUT=$L/st FLAGS_moe30b="--state tight" bash scripts/gpu-state-check.sh moe30b > /dev/null 2>&1
  grep -E "^RESULT|Maximum resident|^step |^step time|failed" $L/st/state.log | tail -6 >> $L/chain.log
  grep -h "plan cache" $L/st/state-moe30b-compact.out >> $L/chain.log
fi
say "chain done"
