#!/usr/bin/env bash
# device call 1: build, the GPU suite, qwen3_5 refused on cuda by name
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
log=$OUT/dev1.log
echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null)" > $log
OUT=/tmp/gt timeout 560 bash scripts/gpu-test.sh gpu > /dev/null 2>&1; echo "gpu-test rc=$?" >> $log
cp /tmp/gt/gpu-test.log $OUT/ 2>/dev/null; cp /tmp/gt/ctest-gpu.log $OUT/ 2>/dev/null
tail -40 /tmp/gt/gpu-test.log >> $log
grep -E "Passed|Failed|\*\*\*|tests passed" /tmp/gt/ctest-gpu.log >> $log 2>/dev/null
cat $log | tail -60
