#!/usr/bin/env bash
# Runs HERE (network to PyPI): downloads the wheels the LoRA peer (bench/peft_lora_bench.py) needs
# and the GPU machine's image lacks, peft and bitsandbytes at pinned versions, into
# third_party/wheels/ (git-ignored; carried to the device). The image has torch, transformers and
# accelerate. bitsandbytes' wheel ships a library per CUDA and ROCm version (43 MB): only the CPU and
# CUDA 13.x ones are kept so the carry stays small. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=third_party/wheels
mkdir -p "$dest"
peft=peft-0.21.0-py3-none-any.whl
bnb=bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl
if [ -f "$dest/$peft" ] && [ -f "$dest/$bnb" ]; then echo "peer-wheels: already in $dest"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64 \
    peft==0.21.0 bitsandbytes==0.50.2 -d "$tmp"
cp "$tmp/$peft" "$dest/"
python3 - "$tmp/$bnb" "$dest/$bnb" <<'PY'
import sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
    for n in zi.namelist():
        if not n.endswith(".so") or any(k in n for k in ("_cpu.", "_cuda130.", "_cuda132.")):
            zo.writestr(n, zi.read(n))
PY
echo "peer-wheels: $(ls "$dest" | wc -l) wheels in $dest ($(du -sh "$dest" | cut -f1))"
