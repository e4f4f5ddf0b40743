#!/usr/bin/env bash
# session 6 call C's work, started by run-c1.sh in its own process session (it outlives call C1;
# call C2 collects it). Logs in /tmp/cc. Order = priority: build + the release kit's setup side by
# side, the GPU tests of this tree's changes, the 8-bit AdamW bench, then the release beside ours
# at 128k, then at 32k.
set -uo pipefail
cd "$1"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=/tmp/cc
say() { echo "$(date -u +%T) $*" >> $L/chain.log; }
say "chain start, tree $(git log --oneline -1 2>/dev/null | cut -c1-60)"
( OUT=$L/gt bash scripts/gpu-test.sh build > $L/build-driver.log 2>&1; say "build rc $?" ) &
( OUT=$L/rel bash bench/release_longctx.sh > $L/rel-setup.log 2>&1; say "release setup rc $?" ) &
wait
multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp:$LD_LIBRARY_PATH"
(cd build-gpu && ctest --output-on-failure -R 'test_cuda_optim|test_cuda_moe|test_optim_state' > $L/tests.log 2>&1; say "tests rc $?")
grep -E "Test +#|tests passed" $L/tests.log >> $L/chain.log
for st in compact tight; do
  echo "## $st"; build-gpu/megatrain bench adamw --state $st --params 1000000000 --grad bf16 --no-scalar 2>&1 | tail -2
done > $L/adamw.log 2>&1
cat $L/adamw.log >> $L/chain.log
say "128k pair"
OUT=$L/rel STEPS=2 RELEASE_TIMEOUT=260 bash bench/release_longctx.sh 128k > $L/rel-128k-driver.log 2>&1
say "32k pair"
OUT=$L/rel STEPS=2 RELEASE_TIMEOUT=200 bash bench/release_longctx.sh 32k > $L/rel-32k-driver.log 2>&1
say "chain done"
