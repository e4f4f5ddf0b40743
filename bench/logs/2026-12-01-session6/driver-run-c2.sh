#!/usr/bin/env bash
# session 6 call C2: waits for chain-c.sh until it is done or $1 seconds pass, brings back its logs.
set -uo pipefail
end=$(( $(date +%s) + ${1:-120} ))
while [ $(date +%s) -lt $end ]; do grep -q "chain done" /tmp/cc/chain.log 2>/dev/null && break; sleep 5; done
cat /tmp/cc/chain.log
cp /tmp/cc/chain.log /tmp/cc/rel/release.log /tmp/cc/rel/longctx.log /tmp/cc/tests.log $OUT/ 2>/dev/null
tar --exclude='cc/gt/build.log' -czf $OUT/cc.tgz -C /tmp cc 2>/dev/null
grep -h -E "^RESULT|^step |stopped|failed" /tmp/cc/rel/release.log | tail -20
