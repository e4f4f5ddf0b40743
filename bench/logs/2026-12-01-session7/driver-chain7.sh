#!/usr/bin/env bash
# session 7 calls 1-2: detached (setsid) so it outlives call 1; call 2 collects it. Logs in /tmp/c7.
# Order = priority: build, the GPU suite with cuDNN required, 8-bit AdamW speed (twice each),
# the Qwen3-30B-A3B shape (only if test_cuda_moe passed), the 7B full vs compact (auto tier),
# the 16-layer Mixtral shape, the attention bench (packed rows: own vs cuDNN's variable-length).
set -uo pipefail
cd "$1"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=/tmp/c7
say() { echo "$(date -u +%T) $*" >> $L/chain.log; }
say "chain start, tree $(git log --oneline -1 2>/dev/null | cut -c1-60)"
OUT=$L/gt bash scripts/gpu-test.sh build > $L/build-driver.log 2>&1; say "build rc $?"
mkdir -p $L/bin && cp build-gpu/megatrain $L/bin/
multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp:$LD_LIBRARY_PATH"
(cd build-gpu && MT_REQUIRE_CUDNN=1 ctest --output-on-failure -L gpu > $L/tests.log 2>&1; say "gpu tests rc $?")
grep -E "Test +#|tests passed" $L/tests.log >> $L/chain.log
for st in compact tight compact tight; do
  echo "## $st"; build-gpu/megatrain bench adamw --state $st --params 1000000000 --grad bf16 --no-scalar 2>&1 | tail -2
done > $L/adamw.log 2>&1
cat $L/adamw.log >> $L/chain.log
if grep -qE "test_cuda_moe .*Passed" $L/tests.log; then
  say "moe30b"; STEPS=3 OUT=$L/st bash scripts/gpu-state-check.sh moe30b > /dev/null 2>&1
  tail -30 $L/st/state.log >> $L/chain.log
else
  say "test_cuda_moe did not pass: no MoE run"
fi
say "7b"; STEPS=3 OUT=$L/st bash scripts/gpu-state-check.sh 7b > /dev/null 2>&1
grep -E "^RESULT|Maximum resident|^gpu tier|^## " $L/st/state.log | tail -8 >> $L/chain.log
if grep -qE "test_cuda_moe .*Passed" $L/tests.log; then
  say "mixtral16l"; STEPS=3 OUT=$L/st bash scripts/gpu-state-check.sh mixtral16l > /dev/null 2>&1
  grep -E "^RESULT|Maximum resident|^gpu tier|^## |failed" $L/st/state.log | tail -5 >> $L/chain.log
fi
say "attention bench"; OUT=$L/ab timeout 240 bash scripts/attention-bench.sh > /dev/null 2>&1; say "attention bench rc $?"
grep -E "docs" $L/ab/attention-bench.log | tail -12 >> $L/chain.log
say "chain done"
