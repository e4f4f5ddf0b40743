#!/usr/bin/env bash
# session 6 device call A: the whole GPU suite at HEAD with cuDNN required, the binary saved for
# later calls, then the 1.5B 16x4096 anchor with our attention and with auto (cuDNN), side by side.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
MT_REQUIRE_CUDNN=1 OUT=$OUT/gt bash scripts/gpu-test.sh gpu > $OUT/gpu-test-driver.log 2>&1; echo "gpu suite rc $?"
grep -E "tests passed|Failed|\*\*\*" $OUT/gt/ctest-gpu.log | head -20
mkdir -p $OUT/bin && cp build-gpu/megatrain $OUT/bin/megatrain
multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp:$LD_LIBRARY_PATH"
for a in own auto; do
  mkdir -p $OUT/b15-$a
  MT_ATTENTION=$a OUT=$OUT/b15-$a FSDP_SHAPES= BENCH_STEPS=4 timeout 200 bash bench/gpu_bench.sh 1.5b > /dev/null 2>&1
  echo "== 1.5b $a"; grep -E "step |tflops|RSS|resident" $OUT/b15-$a/bench.log | tail -6
  rm -f $OUT/b15-$a/trace-*.json
done
