#!/usr/bin/env bash
# The main job on its built-in default: installs what is missing, builds, and runs it.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
scripts/build.sh build
exec build/megatrain bench fwdbwd "$@"
