#!/usr/bin/env bash
# session 8 call 2: waits for chain8.sh until it is done or $1 seconds pass, brings back its logs.
set -uo pipefail
end=$(( $(date +%s) + ${1:-560} ))
while [ $(date +%s) -lt $end ]; do grep -q "chain done" /tmp/c8/chain.log 2>/dev/null && break; sleep 5; done
cat /tmp/c8/chain.log
tar --exclude='c8/gt/build.log' -czf $OUT/c8.tgz -C /tmp c8 2>/dev/null
