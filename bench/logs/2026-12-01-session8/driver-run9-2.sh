#!/usr/bin/env bash
# session 8 call 4: waits for chain9.sh until it is done or $1 seconds pass, brings back its logs.
set -uo pipefail
end=$(( $(date +%s) + ${1:-560} ))
while [ $(date +%s) -lt $end ]; do grep -q "chain done" /tmp/c9/chain.log 2>/dev/null && break; sleep 5; done
cat /tmp/c9/chain.log
tar --exclude='c9/gt/build.log' -czf $OUT/c9.tgz -C /tmp c9 2>/dev/null
