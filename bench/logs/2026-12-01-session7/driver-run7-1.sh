#!/usr/bin/env bash
# session 7 call 1: starts prebuilt/chain7.sh detached, waits up to ~570 s, returns what is there.
set -uo pipefail
rm -rf /tmp/c7 && mkdir -p /tmp/c7
setsid nohup bash prebuilt/chain7.sh "$PWD" > /tmp/c7/chain.out 2>&1 < /dev/null &
for i in $(seq 1 57); do sleep 10; grep -q "chain done" /tmp/c7/chain.log 2>/dev/null && break; done
cat /tmp/c7/chain.log; tail -3 /tmp/c7/chain.out
mkdir -p $OUT/bin && cp /tmp/c7/bin/megatrain $OUT/bin/ 2>/dev/null
cp /tmp/c7/tests.log /tmp/c7/adamw.log $OUT/ 2>/dev/null
grep -E "FAIL|rel |spread|step 1 cpu|compact:" /tmp/c7/tests.log | tail -40
