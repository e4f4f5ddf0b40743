#!/usr/bin/env bash
# session 8 call 3: starts prebuilt/chain9.sh detached, waits up to ~570 s, returns what is there.
set -uo pipefail
rm -rf /tmp/c9 && mkdir -p /tmp/c9
setsid nohup bash prebuilt/chain9.sh "$PWD" > /tmp/c9/chain.out 2>&1 < /dev/null &
for i in $(seq 1 57); do sleep 10; grep -q "chain done" /tmp/c9/chain.log 2>/dev/null && break; done
cat /tmp/c9/chain.log; tail -3 /tmp/c9/chain.out
cp /tmp/c9/tests.log $OUT/ 2>/dev/null; cp /tmp/c9/moe-bench-auto.log $OUT/ 2>/dev/null
grep -E "FAIL" /tmp/c9/tests.log | tail -20
