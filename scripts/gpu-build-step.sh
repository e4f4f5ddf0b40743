# Sourced (not run) by the scripts/gpu-*-check.sh drivers on the GPU machine, after they define
# OUT, log and say. gpu_build_step TAG: builds build-gpu/ through `scripts/gpu-test.sh build`
# (its log to $OUT/gpu-test.log, its last lines to $log); on failure prints the compiler's errors
# and exits 1. Then puts the Debian libraries gpu-test.sh unpacked on LD_LIBRARY_PATH and sets
# OMP_NUM_THREADS to 16 unless set.
gpu_build_step() {
  local gt=/tmp/mt-$1-gt rc multi
  say "== build (scripts/gpu-test.sh build)"
  OUT=$gt bash scripts/gpu-test.sh build > /dev/null 2>&1
  rc=$?
  cp "$gt/gpu-test.log" "$OUT/gpu-test.log" 2>/dev/null
  tail -4 "$gt/gpu-test.log" | tee -a "$log"
  if [ $rc -ne 0 ]; then
    grep -E -B2 -A8 "error|Error" "$gt/build.log" | head -60 | tee -a "$log"
    exit 1
  fi
  multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
  export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
}
