#!/usr/bin/env bash
# Runs tests with the AVX-512 kernels (src/optim/*avx512.c) on a machine without AVX-512: they
# are compiled through SIMDe (Debian's libsimde-dev: every AVX-512 intrinsic in portable C over
# the native AVX2 and FMA, so the fp32 arithmetic is the hardware's), cpu_isa.c is made to report
# AVX-512, and the tests are relinked against that library. A check that the AVX-512 code computes
# what the other paths compute, bit for bit; not a measure of its speed.
#   scripts/avx512-emulated.sh [BUILD_DIR] [TEST...]   (default build-cpu, test_optim_state test_adamw)
# BUILD_DIR is a configured and built CPU tree (scripts/build.sh BUILD_DIR -DMT_CUDA=OFF). Extra
# compiler flags for the emulated files in MT_EMU_CFLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$(cd "${1:-build-cpu}" && pwd)
shift || true
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=(test_optim_state test_adamw)
scripts/deps.sh libsimde-dev
grep -q avx2 /proc/cpuinfo || { echo "avx512-emulated: needs an AVX2 + FMA CPU" >&2; exit 1; }
out=$build/avx512-emulated
rm -rf "$out"
mkdir -p "$out"
cflags=$(sed -n 's/^C_FLAGS = //p' "$build/CMakeFiles/mtcore.dir/flags.make")
emulate() { # SOURCE: $out/NAME.o from SOURCE with SIMDe for <immintrin.h>, no AVX-512 target
  local name
  name=$(basename "$1" .c)
  sed -e 's|#include <immintrin.h>|#define SIMDE_ENABLE_NATIVE_ALIASES\n#include <simde/x86/avx512.h>\n#include "simde_avx512_shim.h"|' \
      -e 's|target("avx512f,avx512bw,avx512vl,avx2,fma")|target("avx2,fma")|' \
      -e 's|__builtin_cpu_supports("avx512[fbwvl]*")|1|g' "$1" >"$out/$name.c"
  # shellcheck disable=SC2086
  cc $cflags -D_GNU_SOURCE -mavx2 -mfma -Wno-psabi -Wno-deprecated-declarations ${MT_EMU_CFLAGS:-} \
     -I"$root/src" -I"$root/src/optim" -I"$root/src/core" -I"$root/scripts" \
     -c "$out/$name.c" -o "$out/$name.c.o"
}
emulate src/optim/kernel_avx512.c
emulate src/optim/full_avx512.c
emulate src/core/cpu_isa.c
cp "$build/libmtcore.a" "$out/libmtcore.a"
ar r "$out/libmtcore.a" "$out"/kernel_avx512.c.o "$out"/full_avx512.c.o "$out"/cpu_isa.c.o 2>/dev/null
rc=0
for t in "${tests[@]}"; do
  link=$(cat "$build/CMakeFiles/$t.dir/link.txt")
  link=${link// libmtcore.a/ $out/libmtcore.a}
  link=${link//-o $t /-o $out/$t }
  (cd "$build" && eval "$link")
  echo "== $t, AVX-512 through SIMDe"
  if (cd "$build" && MT_BIN="$build/megatrain" MT_FIXTURES="$root/tests/fixtures" "$out/$t" >"$out/$t.log" 2>&1); then
    grep -E "paths here|PASSED" "$out/$t.log" || true
  else
    rc=1
    tail -30 "$out/$t.log"
  fi
done
exit $rc
