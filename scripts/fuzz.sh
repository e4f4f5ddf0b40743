#!/usr/bin/env bash
# Fuzzes the parsers: builds the libFuzzer harnesses (tests/fuzz) into build-fuzz/ with clang,
# ASan and UBSan, writes their seed corpora from the fixtures, and runs each target for SECONDS
# (default 60). Prints per target the executions done and any crash, leak or timeout (the input is
# kept under build-fuzz/crashes/<target>/); exits non-zero when any target found one.
#   scripts/fuzz.sh [SECONDS] [TARGET...]       e.g. scripts/fuzz.sh 300 fuzz_config fuzz_packed
# The corpus each run grows stays in build-fuzz/corpus/<target>/ for the next run; the seeds are
# rewritten every time; inputs of fixed bugs (tests/fuzz/regress/<target>/) are replayed first.
# MT_FUZZ_JOBS=N runs N targets at a time (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
[[ $secs =~ ^[0-9]+$ && $secs -gt 0 ]] || { echo "megatrain: fuzz.sh: SECONDS must be a positive integer (got '$secs')" >&2; exit 2; }

scripts/deps.sh clang libclang-rt-dev libomp-dev
dir=build-fuzz
CC=clang cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMT_FUZZ=ON -DMT_CUDA=OFF >/dev/null
mkdir -p "$dir/logs"
if ! cmake --build "$dir" --target fuzz -j"$(nproc)" >"$dir/logs/build.log" 2>&1; then
  grep -v -E '^\[ *[0-9]+%\]' "$dir/logs/build.log" >&2
  echo "megatrain: fuzz.sh: the fuzz build failed (log: $dir/logs/build.log)" >&2
  exit 1
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
for t in "${targets[@]}"; do
  [ -x "$dir/$t" ] || { echo "megatrain: fuzz.sh: no target $t (the targets are tests/fuzz/fuzz_*.c)" >&2; exit 2; }
done

rm -rf "$dir/seeds"
"$dir/fz_seeds" . "$dir/seeds"

# each target's dictionary: the JSON syntax plus its own words (tests/fuzz/dict)
declare -A dicts=(
  [fuzz_safetensors]="json safetensors"
  [fuzz_safetensors_index]="json safetensors index multipart"
  [fuzz_config]="json config"
  [fuzz_tokenizer_load]="json tokenizer special multipart"
  [fuzz_tokenizer_encode]="special"
  [fuzz_tokenizer_decode]=""
  [fuzz_packed]="packed"
  [fuzz_tokens]=""
  [fuzz_chat_pack]="json chat special multipart"
  [fuzz_checkpoint]="json safetensors config checkpoint multipart"
)

tmp=${MT_FUZZ_TMP:-$( [ -w /dev/shm ] && echo /dev/shm || echo /tmp )/mtfuzz-run-$$}
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# halt_on_error: a report is a crash; the suppressions are known bugs being fixed elsewhere (see the files)
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/fuzz/ubsan.supp
export ASAN_OPTIONS=detect_leaks=1
export LSAN_OPTIONS=print_suppressions=0:suppressions=$PWD/tests/fuzz/lsan.supp

run_one() {
  local t=$1 log="$dir/logs/$1.log" crashes="$dir/crashes/$1"
  mkdir -p "$dir/corpus/$t" "$crashes" "$dir/logs" "$dir/dict"
  local dict="$dir/dict/$t.dict" args=()
  : >"$dict"
  for d in ${dicts[$t]:-}; do cat "tests/fuzz/dict/$d.dict" >>"$dict"; done
  [ -s "$dict" ] && args+=(-dict="$dict")
  local corpora=("$dir/corpus/$t" "$dir/seeds/$t")
  [ -d "tests/fuzz/regress/$t" ] && corpora+=("tests/fuzz/regress/$t")
  local mark="$dir/logs/$t.start"
  touch "$mark"
  local rc=0
  MT_FUZZ_TMP="$tmp/$t" "$dir/$t" -max_total_time="$secs" -print_final_stats=1 -timeout=20 \
    -rss_limit_mb=2048 -artifact_prefix="$crashes/" "${args[@]}" "${corpora[@]}" >"$log" 2>&1 || rc=$?
  local execs units
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  units=$(ls "$dir/corpus/$t" | wc -l)
  if [ $rc -ne 0 ]; then
    local found; found=$(find "$crashes" -type f -newer "$mark" | tr '\n' ' ')
    echo "$t: FAILED (exit $rc) after ${execs:-?} executions: $(grep -m1 -E 'ERROR|runtime error|fuzz: .*invariant|fatal' "$log" || echo 'see the log')"
    echo "$t:   input ${found:-(none kept)}; log $log"
    return 1
  fi
  echo "$t: ${execs:-?} executions in ${secs} s, corpus $units inputs, no crash"
}

jobs=${MT_FUZZ_JOBS:-1}
failed=0
pids=()
for t in "${targets[@]}"; do
  if [ "$jobs" -le 1 ]; then run_one "$t" || failed=1; continue; fi
  run_one "$t" >"$dir/logs/$t.summary" 2>&1 & pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || failed=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ "$jobs" -gt 1 ]; then for t in "${targets[@]}"; do cat "$dir/logs/$t.summary"; done; fi
[ $failed -eq 0 ] || { echo "megatrain: fuzz.sh: a target failed (inputs under $dir/crashes/)" >&2; exit 1; }
