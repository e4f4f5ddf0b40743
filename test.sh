#!/usr/bin/env bash
# The tests: installs what is missing, builds the normal and the AddressSanitizer+UBSan builds,
# and runs every test in both.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
scripts/build.sh build
(cd build && ctest --output-on-failure -j2)
scripts/build.sh build-asan -DMT_SANITIZE=address -DMT_CUDA=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2)
