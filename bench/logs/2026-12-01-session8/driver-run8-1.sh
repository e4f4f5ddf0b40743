#!/usr/bin/env bash
# session 8 call 1: starts prebuilt/chain8.sh detached, waits up to ~570 s, returns what is there.
set -uo pipefail
rm -rf /tmp/c8 && mkdir -p /tmp/c8
setsid nohup bash prebuilt/chain8.sh "$PWD" > /tmp/c8/chain.out 2>&1 < /dev/null &
for i in $(seq 1 57); do sleep 10; grep -q "chain done" /tmp/c8/chain.log 2>/dev/null && break; done
cat /tmp/c8/chain.log; tail -3 /tmp/c8/chain.out
cp /tmp/c8/tests.log $OUT/ 2>/dev/null; cp /tmp/c8/mb/moe-bench.log $OUT/ 2>/dev/null
grep -E "FAIL|rel |spread|grouped vs|cudnn" /tmp/c8/tests.log | tail -40
