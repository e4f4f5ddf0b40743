#!/usr/bin/env bash
# Installs the Debian packages megatrain builds with (plus any named as arguments) when any is
# missing. Idempotent. Open MPI is optional for the build (the mpi comm, mpirun -np N and its tests)
# but installed here so that CI runs the multi-rank tests.
set -euo pipefail
packages=(build-essential cmake pkg-config libjansson-dev libopenblas-openmp-dev libcmocka-dev libpcre2-dev libutf8proc-dev libxxhash-dev libopenmpi-dev openmpi-bin "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "megatrain: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
