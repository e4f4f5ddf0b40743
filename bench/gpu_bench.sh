#!/usr/bin/env bash
# Issue 4's benchmark, on the H200 machine, from the repository root, after scripts/gpu-test.sh has
# built build-gpu/ (or with MT_BIN set): random-init Qwen2.5-1.5B, 3B and 7B shapes at T = 4096 with
# 64k tokens per step, megatrain beside PyTorch FSDP2 CPU offload on the same model and batch, then
# the 7B again with --gpu-mem 24G. Writes everything to ${OUT:-/tmp}/bench.log.
#   bench/gpu_bench.sh [shapes...]   (default: 1.5b 3b 7b)
# Env: BENCH_BATCH/SEQ/MICRO/STEPS, FSDP_SHAPES, FSDP_MICRO_<shape> (e.g. FSDP_MICRO_3b=8: skip
# the full-batch FSDP2 attempt known to run out of memory), MEGATRAIN_FLAGS (extra train flags).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
log=$out/bench.log
bin=${MT_BIN:-build-gpu/megatrain}
B=${BENCH_BATCH:-16}; T=${BENCH_SEQ:-4096}; MB=${BENCH_MICRO:-2}; STEPS=${BENCH_STEPS:-4}
shapes=${*:-1.5b 3b 7b}
fsdp_shapes=${FSDP_SHAPES-1.5b 3b}   # FSDP2: no 7B step in 280 s (docs/DESIGN.md, "The test machine")
say() { echo "$@" | tee -a "$log"; }
say "# megatrain bench $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$log"
free -g | head -2 | tee -a "$log"
# ids below the smallest vocabulary of the shapes (1.5B/3B: 151936)
python3 bench/make_tokens.py 151936 $(( (STEPS + 1) * B * T + 1 )) /tmp/bench_tokens.bin

run_megatrain() { # shape extra-flags...
  local shape=$1; shift
  local dir=/tmp/bench-$shape
  rm -rf "$dir"
  say "## megatrain $shape B=$B T=$T micro=$MB $*"
  /usr/bin/time -v "$bin" train --init bench/configs/qwen2.5-$shape.json --data /tmp/bench_tokens.bin \
    --out "$dir" --steps "$STEPS" --batch "$B" --seq "$T" --micro-batch "$MB" --no-shuffle \
    --device cuda --no-save --warmup 1 --trace "$dir.trace.json" ${MEGATRAIN_FLAGS:-} "$@" >"$dir.log" 2>&1
  local rc=$?
  grep -E "^(memory|             |training|step )" "$dir.log" | tee -a "$log"
  grep -E "Maximum resident set size" "$dir.log" | tee -a "$log"
  [ $rc -eq 0 ] || { say "megatrain $shape failed (rc $rc):"; tail -5 "$dir.log" | tee -a "$log"; return; }
  python3 bench/summarize.py "$dir/metrics.jsonl" "$shape $*" | tee -a "$log" | tee /tmp/bench-last-result
  last_tflops=$(grep -o 'tflops=[0-9.e+]*' /tmp/bench-last-result | cut -d= -f2)
  python3 bench/trace_summary.py "$dir.trace.json" "$shape $*" | tee -a "$log"
  cp "$dir.trace.json" "$out/trace-$shape${1:+-mem}.json" 2>/dev/null
}

run_fsdp2() { # shape: the whole batch at once, halving the micro-batch while it runs out of memory
  local v=FSDP_MICRO_${1//./_} mb
  mb=${!v:-$B}
  while :; do
    say "## FSDP2 CPU offload $1 B=$B T=$T micro-batch $mb"
    timeout 400 python3 bench/baselines/fsdp2_offload.py "$1" "$B" "$T" "$STEPS" "$mb" > /tmp/fsdp2-$1.log 2>&1
    grep -E "RESULT|step|params|Error|error" /tmp/fsdp2-$1.log | tail -8 | tee -a "$log"
    if grep -q RESULT /tmp/fsdp2-$1.log; then
      local theirs
      theirs=$(grep RESULT /tmp/fsdp2-$1.log | grep -o '6NT-TFLOPS [0-9.]*' | cut -d' ' -f2)
      [ -n "${last_tflops:-}" ] && [ -n "$theirs" ] &&
        say "RATIO $1 B=$B T=$T megatrain $last_tflops / FSDP2 $theirs TFLOPS = $(python3 -c "print(f'{$last_tflops/$theirs:.2f}')")x"
      return
    fi
    grep -q -i "out of memory" /tmp/fsdp2-$1.log && [ "$mb" -gt 1 ] || return
    mb=$((mb / 2))
  done
}

for s in $shapes; do
  run_megatrain "$s"
  case " $fsdp_shapes " in *" $s "*) run_fsdp2 "$s" ;; esac
done
case " $shapes " in *" 7b "*) run_megatrain 7b --gpu-mem 24G ;; esac
say "# done"
