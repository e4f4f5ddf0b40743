#!/usr/bin/env bash
# Runs HERE (Debian, with apt): downloads the .debs that the GPU machine lacks (Ubuntu 24.04 with
# nvcc, cmake and gcc but none of our libraries and no apt) into third_party/debs/, where
# scripts/gpu-test.sh extracts them. Idempotent; third_party/debs/ is git-ignored and travels to the
# device with `carry`.
#
# The closure, checked by hand against `apt-cache show` (Depends):
#   libjansson-dev -> libjansson4 -> libc6
#   libopenblas-openmp-dev -> libopenblas0-openmp -> libc6, libgomp1, libgfortran5
#   libgfortran5 -> gcc-12-base, libc6, libgcc-s1, libquadmath0;  libquadmath0 -> gcc-12-base, libc6
#   libopenblas-dev -> libopenblas0 (a metapackage), libopenblas-openmp-dev
#   libcmocka-dev -> libcmocka0 -> libc6
#   libpcre2-dev -> libpcre2-8-0, libpcre2-16-0, libpcre2-32-0, libpcre2-posix3 (-> libpcre2-8-0), libc-dev
#   libutf8proc-dev -> libutf8proc2 -> libc6
#   libxxhash-dev -> libxxhash0 -> libc6
#   pkgconf-bin -> libpkgconf3 -> libc6   (pkg-config, in case the image has none)
# libc6, libc-dev (libc6-dev), libgcc-s1 and libgomp1 are newer on Ubuntu 24.04 (gcc 13, glibc 2.39) and are left out.
# --runtime: also copies the run-time packages alone (no -dev, no pkgconf) into third_party/debs-run/,
# for running binaries built here (scripts/gpu-prebuilt.sh with MT_DEBS=third_party/debs-run).
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=(gcc-12-base libgfortran5 libquadmath0 libjansson4 libopenblas0-openmp libcmocka0 libpcre2-8-0
         libutf8proc2 libxxhash0)
copy_runtime() {
  [ "${1:-}" = --runtime ] || return 0
  mkdir -p third_party/debs-run
  for p in "${runtime[@]}"; do cp "third_party/debs/${p}"_*.deb third_party/debs-run/; done
  echo "device-deps: ${#runtime[@]} run-time packages in third_party/debs-run"
}
packages=(libjansson4 libjansson-dev
          libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev libopenblas0
          libcmocka0 libcmocka-dev
          libgfortran5 libquadmath0 gcc-12-base
          libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
          libutf8proc-dev libutf8proc2
          libxxhash-dev libxxhash0
          pkgconf-bin libpkgconf3)
dir=third_party/debs
mkdir -p "$dir"
missing=()
for p in "${packages[@]}"; do
  compgen -G "$dir/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "device-deps: all ${#packages[@]} packages already in $dir"
  copy_runtime "$@"
  exit 0
fi
# apt-cache needs fresh lists to know the current versions
[ -n "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ] || apt-get update -qq
(cd "$dir" && apt-get download "${missing[@]}")
for p in "${packages[@]}"; do
  compgen -G "$dir/${p}_*.deb" >/dev/null || { echo "device-deps: $p did not download" >&2; exit 1; }
done
echo "device-deps: $(ls "$dir"/*.deb | wc -l) packages in $dir ($(du -sh "$dir" | cut -f1))"
copy_runtime "$@"
