#!/usr/bin/env bash
# On the GPU machine after scripts/gpu-test.sh has built build-gpu/ (issue 10, bench/RESULTS.md):
# the optimizer state formats on the H200.
#   scripts/gpu-state-check.sh adamw      megatrain bench adamw per --state (every core; AVX-512 and AVX2)
#   scripts/gpu-state-check.sh 7b         Qwen2.5-7B 16x4096: --state full, then compact, side by side
#   scripts/gpu-state-check.sh 14b        Qwen2.5-14B 16x4096 --state compact (planner's defaults)
#   scripts/gpu-state-check.sh 32b        Qwen2.5-32B 16x4096 --state tight, GPU tier auto
#   scripts/gpu-state-check.sh moe30b     Qwen3-30B-A3B 16x4096 --state compact (issue 14)
#   scripts/gpu-state-check.sh mixtral16l Mixtral-8x7B with 16 layers 16x4096 --state compact
# (several phases in one call: scripts/gpu-state-check.sh adamw 7b). Appends to $OUT/state.log;
# each run's whole output goes to $OUT/state-<name>.out. Env: STEPS (default 4), FLAGS_<phase>.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/state.log
bin=${MT_BIN:-build-gpu/megatrain}
multi=$(ls -d "${MT_DEPS:-/tmp/mtdeps}"/usr/lib/*-linux-gnu 2>/dev/null | head -1) # gpu-test.sh's libraries
[ -n "$multi" ] && export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
STEPS=${STEPS:-4}
say() { echo "$@" | tee -a "$log"; }
say "# gpu-state-check $* $(date -u +%FT%TZ)"
free -g | head -2 | tee -a "$log"

tokens() { # vocabulary: random tokens below it, one file per vocabulary
  [ -f /tmp/state_tokens_$1.bin ] || python3 bench/make_tokens.py "$1" $(( (STEPS + 1) * 16 * 4096 + 1 )) /tmp/state_tokens_$1.bin
}

run() { # name shape flags... (shape: bench/configs/qwen2.5-SHAPE.json, or a path to a config)
  local name=$1 shape=$2; shift 2
  local cfg=bench/configs/qwen2.5-$shape.json
  [ -f "$shape" ] && cfg=$shape
  local vocab
  vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$cfg")
  tokens "$vocab"
  say "## $name: $cfg 16x4096 $*"
  /usr/bin/time -v "$bin" train --init "$cfg" --data /tmp/state_tokens_$vocab.bin \
    --out /tmp/state-run --overwrite --steps "$STEPS" --batch 16 --seq 4096 --no-shuffle --device cuda \
    --no-save --warmup 1 "$@" > "$OUT/state-$name.out" 2>&1
  local rc=$?
  grep -E "^(micro-batch|optimizer state|memory|             |training|host threads|step |gpu tier|step time|per layer|tiles)" "$OUT/state-$name.out" | tee -a "$log"
  grep -E "Maximum resident set size|Elapsed" "$OUT/state-$name.out" | tee -a "$log"
  [ $rc -eq 0 ] || { say "failed (rc $rc):"; tail -5 "$OUT/state-$name.out" | tee -a "$log"; return; }
  python3 bench/summarize.py /tmp/state-run/metrics.jsonl "$name" | tee -a "$log"
}

for phase in "$@"; do
  case $phase in
  adamw)
    for isa in avx512 avx2; do
      for st in full compact tight; do
        say "## bench adamw --state $st, MT_ADAMW_ISA=$isa, $(nproc) threads"
        MT_ADAMW_ISA=$isa "$bin" bench adamw --state "$st" --params 1000000000 --grad bf16 --no-scalar 2>&1 | tee -a "$log"
      done
    done ;;
  7b)
    run 7b-full 7b --state full ${FLAGS_7b:-}
    run 7b-compact 7b --state compact ${FLAGS_7b:-} ;;
  14b) run 14b-compact 14b --state compact ${FLAGS_14b:-} ;;
  32b) run 32b-tight 32b --state tight ${FLAGS_32b:-} ;;
  moe30b) run moe30b-compact bench/configs/qwen3-30b-a3b.json --state compact ${FLAGS_moe30b:-} ;;
  mixtral16l) run mixtral16l-compact bench/configs/mixtral-8x7b-16l.json --state compact ${FLAGS_mixtral16l:-} ;;
  *) say "unknown phase $phase" ;;
  esac
done
exit 0
