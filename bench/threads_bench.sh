#!/usr/bin/env bash
# The OpenMP wait policy on a busy machine (issue 9, bench/RESULTS.md "Threads"): megatrain's
# default (OMP_WAIT_POLICY unset -> PASSIVE, src/cli/process_env.c) against libgomp's own default
# (OMP_WAIT_POLICY set empty: libgomp warns and keeps its spin-then-sleep), whole processes, runs
# alternating A B A B, for generate and a short CPU training run: first as the machine is, then
# with two more spinning processes. From a directory holding t.bin (byte tokens) and a model in
# run/checkpoints/step_00000002 (`megatrain train --init configs/tiny-bytes.json --data t.bin
# --out run --steps 2 --batch 4 --seq 128`).
#   MT_BIN=.../megatrain MT_SRC=<repo> bench/threads_bench.sh [runs]
set -uo pipefail
B=${MT_BIN:-build/megatrain}
N=${1:-3}
G="generate --model run/checkpoints/step_00000002 --prompt The --tokens 100 --top-k 20 --ignore-eos --context 128"
T="train --init ${MT_SRC:-.}/configs/tiny-bytes.json --data t.bin --steps 3 --batch 8 --seq 128 --device cpu --no-save --overwrite --out rb"
wall() { /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -1; }
pair() { # label command-args: libgomp default vs megatrain default, N alternating runs each
  local a=() b=()
  for _ in $(seq "$N"); do
    a+=("$(wall env OMP_WAIT_POLICY= $B $2)")
    b+=("$(wall env -u OMP_WAIT_POLICY $B $2)")
  done
  echo "$1: libgomp default ${a[*]} s | megatrain default (passive) ${b[*]} s"
}
echo "load: $(uptime)"
pair "generate" "$G"
pair "train" "$T"
timeout 1800 yes >/dev/null & y1=$!
timeout 1800 yes >/dev/null & y2=$!
echo "load with two spinning processes: $(uptime)"
pair "generate, busy" "$G"
pair "train, busy" "$T"
kill $y1 $y2 2>/dev/null
