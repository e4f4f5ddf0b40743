#!/usr/bin/env bash
# The tests: installs what is missing, builds, and runs every test in the normal build and under
# AddressSanitizer + UBSan, then the threaded schedule tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
scripts/build.sh build
(cd build && ctest --output-on-failure -j2)
scripts/build.sh build-asan -DMT_SANITIZE=address -DMT_CUDA=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2)
scripts/build.sh build-tsan -DMT_SANITIZE=thread -DMT_CUDA=OFF
(cd build-tsan && ctest --output-on-failure -R 'test_engine|test_adamw|test_checkpoint')
