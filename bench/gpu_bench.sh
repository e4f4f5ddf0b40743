#!/usr/bin/env bash
# Issue 4's benchmark, on the H200 machine, from the repository root, after scripts/gpu-test.sh has
# built build-gpu/ (or with MT_BIN set): random-init Qwen2.5-1.5B, 3B and 7B shapes at T = 4096 with
# 64k tokens per step, megatrain beside PyTorch FSDP2 CPU offload on the same model and batch, then
# the 7B again with --gpu-mem 24G. Writes everything to ${OUT:-/tmp}/bench.log.
#   bench/gpu_bench.sh [shapes...]   (default: 1.5b 3b 7b)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
log=$out/bench.log
bin=${MT_BIN:-build-gpu/megatrain}
B=${BENCH_BATCH:-16}; T=${BENCH_SEQ:-4096}; MB=${BENCH_MICRO:-2}; STEPS=${BENCH_STEPS:-4}
shapes=${*:-1.5b 3b 7b}
fsdp_shapes=${FSDP_SHAPES-1.5b 3b}   # FSDP2 finished no 7B step in 280 s (HARDWARE.md)
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
    --device cuda --no-save --warmup 1 "$@" >"$dir.log" 2>&1
  local rc=$?
  grep -E "^(memory|             |training|step )" "$dir.log" | tee -a "$log"
  grep -E "Maximum resident set size" "$dir.log" | tee -a "$log"
  [ $rc -eq 0 ] || { say "megatrain $shape failed (rc $rc):"; tail -5 "$dir.log" | tee -a "$log"; return; }
  python3 bench/summarize.py "$dir/metrics.jsonl" "$shape $*" | tee -a "$log"
}

run_fsdp2() { # shape
  say "## FSDP2 CPU offload $1 B=$B T=$T"
  timeout 400 python3 bench/baselines/fsdp2_offload.py "$1" "$B" "$T" "$STEPS" 2>&1 | grep -E "RESULT|step|params|Error|error" | tail -8 | tee -a "$log"
}

for s in $shapes; do
  run_megatrain "$s"
  case " $fsdp_shapes " in *" $s "*) run_fsdp2 "$s" ;; esac
done
case " $shapes " in *" 7b "*) run_megatrain 7b --gpu-mem 24G ;; esac
say "# done"
