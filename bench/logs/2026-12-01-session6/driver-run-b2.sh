#!/usr/bin/env bash
# session 6 call B2: waits for call B1's 512k run and brings its logs back.
set -uo pipefail
( while :; do nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader >> /tmp/l512/smi.log; sleep 20; done ) > /dev/null 2>&1 &
smi=$!
for i in $(seq 1 57); do
  pgrep -f "megatrain train" > /dev/null || { echo "train process gone at $(date -u +%T)"; break; }
  sleep 10
done
kill $smi 2>/dev/null
cp /tmp/l512/out/* /tmp/l512/driver.log /tmp/l512/smi.log /tmp/l512/free.log $OUT/ 2>/dev/null
cat /tmp/l512/out/longctx.log 2>/dev/null | tail -30
tail -5 /tmp/l512/out/longctx-512k.out 2>/dev/null
