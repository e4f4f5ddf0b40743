#!/usr/bin/env bash
# session 7 call 2: waits for chain7.sh until it is done or $1 seconds pass, brings back its logs.
set -uo pipefail
end=$(( $(date +%s) + ${1:-560} ))
while [ $(date +%s) -lt $end ]; do grep -q "chain done" /tmp/c7/chain.log 2>/dev/null && break; sleep 5; done
cat /tmp/c7/chain.log
tar --exclude='c7/gt/build.log' --exclude='c7/bin' -czf $OUT/c7.tgz -C /tmp c7 2>/dev/null
