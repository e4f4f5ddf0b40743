#!/usr/bin/env bash
# Installs the cuDNN frontend's C++ headers (header-only; the CUDA backend's attention_cudnn.cu builds
# its fused flash attention graphs with them) into third_party/cudnn-frontend/include. They come from
# the PyPI wheel nvidia-cudnn-frontend at a pinned version, checked against its sha256; only the
# wheel's include/ is kept. Idempotent; needs pip and unzip (or python3) and the network once.
# third_party/cudnn-frontend/ is git-ignored; a machine without network (the GPU machine) gets it
# carried along. scripts/build.sh calls this when nvcc exists; a failure there only leaves the
# cuDNN path out of the build (CMake says so), it does not stop the build.
# It also copies this machine's cuDNN headers (cudnn*.h, when it has them) into
# third_party/cudnn-frontend/cudnn/include: the build's last resort for cudnn.h on a machine whose
# cuDNN came without headers (a Python wheel's libraries); libcudnn.so.9 is loaded at run time, and
# the frontend adapts to the version it finds then.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
# the cp311 manylinux wheel (the headers are the same in every wheel of a version)
wheel=nvidia_cudnn_frontend-${version}-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
dest=third_party/cudnn-frontend
stamp=$dest/VERSION

copy_cudnn_headers() {
  local d
  for d in /usr/local/cuda/include /usr/include /usr/include/x86_64-linux-gnu; do
    if [ -f "$d/cudnn.h" ] && [ -f "$d/cudnn_version.h" ]; then
      mkdir -p "$dest/cudnn/include"
      cp -f "$d"/cudnn*.h "$dest/cudnn/include/"
      return 0
    fi
  done
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && [ -f "$dest/include/cudnn_frontend.h" ]; then
  [ -f "$dest/cudnn/include/cudnn.h" ] || copy_cudnn_headers
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=(python3 -m pip)
command -v python3 >/dev/null || pip=(pip)
"${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$version" >&2
[ -f "$tmp/$wheel" ] || { echo "cudnn-frontend: pip did not bring $wheel" >&2; exit 1; }
echo "$sha256  $tmp/$wheel" | sha256sum -c --quiet - || {
  echo "cudnn-frontend: $wheel does not match its pinned sha256" >&2; exit 1; }
mkdir -p "$tmp/x"
if command -v unzip >/dev/null; then
  unzip -q "$tmp/$wheel" 'include/*' -d "$tmp/x"
else
  python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' "$tmp/$wheel" "$tmp/x"
fi
[ -f "$tmp/x/include/cudnn_frontend.h" ] || { echo "cudnn-frontend: no include/cudnn_frontend.h in $wheel" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp/x/include" "$dest/include"
echo "$version" > "$stamp"
copy_cudnn_headers
echo "cudnn-frontend: $version headers in $dest/include ($(du -sh "$dest" | cut -f1))" >&2
