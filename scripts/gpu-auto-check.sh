#!/usr/bin/env bash
# On the GPU machine after scripts/gpu-test.sh has built build-gpu/ (issue 9, bench/RESULTS.md):
# the planner's defaults on the Qwen2.5-7B shape at T = 4096, 16 sequences a step — `--micro-batch
# auto` on the whole GPU against the micro-batch 2 measured before, and auto in 24 GiB with no other
# flag — then a non-finite run on the GPU (initializer_range 1e25: every step skipped, exit 1, no
# checkpoint). Appends to $OUT/auto.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
log=$OUT/auto.log
bin=${MT_BIN:-build-gpu/megatrain}
multi=$(ls -d "${MT_DEPS:-/tmp/mtdeps}"/usr/lib/*-linux-gnu 2>/dev/null | head -1) # gpu-test.sh's libraries
[ -n "$multi" ] && export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
STEPS=${STEPS:-4}
say() { echo "$@" | tee -a "$log"; }
say "# gpu-auto-check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
python3 bench/make_tokens.py 151936 $(( (STEPS + 1) * 16 * 4096 + 1 )) /tmp/auto_tokens.bin
for flags in "" "--micro-batch 2" "--gpu-mem 24G"; do
  say "## 7B 16x4096 ${flags:-(defaults)}"
  /usr/bin/time -v "$bin" train --init bench/configs/qwen2.5-7b.json --data /tmp/auto_tokens.bin --out /tmp/auto \
    --overwrite --steps "$STEPS" --batch 16 --seq 4096 --no-shuffle --device cuda --no-save --warmup 1 $flags \
    > /tmp/auto.out 2>&1
  rc=$?
  grep -E "^(micro-batch|memory|             |training|host threads|step )" /tmp/auto.out | tee -a "$log"
  grep -E "Maximum resident set size" /tmp/auto.out | tee -a "$log"
  [ $rc -eq 0 ] || { say "failed (rc $rc):"; tail -5 /tmp/auto.out | tee -a "$log"; continue; }
  python3 bench/summarize.py /tmp/auto/metrics.jsonl "7b ${flags:-auto}" | tee -a "$log"
done
say "## non-finite on the GPU: tiny-bytes with initializer_range 1e25"
sed 's/"initializer_range": 0.02/"initializer_range": 1e25/' configs/tiny-bytes.json > /tmp/nan.json
python3 bench/make_tokens.py 320 20000 /tmp/nan.bin
"$bin" train --init /tmp/nan.json --data /tmp/nan.bin --out /tmp/nanrun --overwrite --steps 6 --save-every 1 \
  --batch 4 --seq 64 --device cuda > /tmp/nan.out 2>&1
say "exit status $? (want 1); checkpoints: $(ls /tmp/nanrun/checkpoints 2>/dev/null | tr '\n' ' ')"
grep -E "skipped|stopping|megatrain:" /tmp/nan.out | head -6 | tee -a "$log"
exit 0
