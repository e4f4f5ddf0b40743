#!/usr/bin/env bash
# session 6 call C1: starts prebuilt/chain-c.sh detached, waits up to ~580 s, returns what is there.
set -uo pipefail
rm -rf /tmp/cc && mkdir -p /tmp/cc
setsid nohup bash prebuilt/chain-c.sh "$PWD" > /tmp/cc/chain.out 2>&1 < /dev/null &
for i in $(seq 1 58); do sleep 10; grep -q "chain done" /tmp/cc/chain.log 2>/dev/null && break; done
cat /tmp/cc/chain.log
grep -h -E "^RESULT|^step |stopped|failed" /tmp/cc/rel/release.log 2>/dev/null | tail -12
