#!/usr/bin/env bash
# On the GPU machine after scripts/gpu-test.sh has built build-gpu/ (issue 11, bench/RESULTS.md):
# the Qwen2.5-7B shape at long context, batch 1, random init and tokens.
#   scripts/gpu-longctx-check.sh 32k 128k 512k 4k
# Each phase is one `megatrain train` at that --seq (4k: 16 x 4096, the short-context anchor; 32kx2:
# 2 x 32768, the MegaTrain release's shape in bench/release_longctx.sh), with
# the planner's defaults (tiles, checkpoint placement, GPU tier). Env: STEPS (default 2), ATTN
# (MT_ATTENTION for these runs; default cudnn), STATE (default compact), CONFIG (default
# bench/configs/qwen2.5-7b.json), FLAGS (more train flags), TAG (added to the run names).
# Appends to $OUT/longctx.log; each run's whole output goes to $OUT/longctx-<name>.out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/longctx.log
bin=${MT_BIN:-build-gpu/megatrain}
multi=$(ls -d "${MT_DEPS:-/tmp/mtdeps}"/usr/lib/*-linux-gnu 2>/dev/null | head -1) # gpu-test.sh's libraries
[ -n "$multi" ] && export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
STEPS=${STEPS:-2}
ATTN=${ATTN:-cudnn}
STATE=${STATE:-compact}
CONFIG=${CONFIG:-bench/configs/qwen2.5-7b.json}
say() { echo "$@" | tee -a "$log"; }
say "# gpu-longctx-check $* ATTN=$ATTN STATE=$STATE STEPS=$STEPS CONFIG=$CONFIG FLAGS=${FLAGS:-} $(date -u +%FT%TZ)"
free -g | head -2 | tee -a "$log"

run() { # name batch seq
  local name=$1${TAG:-} batch=$2 seq=$3
  local data=/tmp/longctx_tokens_$seq.bin
  [ -f "$data" ] || python3 bench/make_tokens.py 151936 $(( (STEPS + 1) * batch * seq + 1 )) "$data"
  say "## $name: $batch x $seq --state $STATE MT_ATTENTION=$ATTN ${FLAGS:-}"
  MT_ATTENTION=$ATTN /usr/bin/time -v "$bin" train --init "$CONFIG" --data "$data" \
    --out /tmp/longctx-run --overwrite --steps "$STEPS" --batch "$batch" --seq "$seq" --no-shuffle \
    --device cuda --no-save --warmup 1 --state "$STATE" ${FLAGS:-} > "$OUT/longctx-$name.out" 2>&1
  local rc=$?
  grep -E "^(micro-batch|optimizer state|memory|             |training|layer|step |megatrain: (warning|cuDNN))" \
    "$OUT/longctx-$name.out" | tee -a "$log"
  grep -E "Maximum resident set size|Elapsed" "$OUT/longctx-$name.out" | tee -a "$log"
  [ $rc -eq 0 ] || { say "failed (rc $rc):"; tail -5 "$OUT/longctx-$name.out" | tee -a "$log"; return; }
  python3 bench/summarize.py /tmp/longctx-run/metrics.jsonl "$name" | tee -a "$log"
}

for phase in "$@"; do
  case $phase in
  4k) run 4k 16 4096 ;;
  32k) run 32k 1 32768 ;;
  32kx2) run 32kx2 2 32768 ;; # bench/release_longctx.sh: the release's 32k batch
  128k) run 128k 1 131072 ;;
  512k) run 512k 1 524288 ;;
  *) say "unknown phase $phase" ;;
  esac
done
exit 0
