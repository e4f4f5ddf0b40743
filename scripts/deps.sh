#!/usr/bin/env bash
# Installs the Debian packages megatrain builds with (plus any named as arguments) when any is
# missing. Idempotent.
set -euo pipefail
packages=(build-essential cmake pkg-config libjansson-dev libopenblas-openmp-dev libcmocka-dev libpcre2-dev libutf8proc-dev libxxhash-dev "$@")
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
