#!/usr/bin/env bash
# transformers loads what `megatrain convert` writes of the multimodal fixture qwen3_5_vl_mtp (fp32
# and bf16) as Qwen3_5ForConditionalGeneration and as the text model: no missing or unexpected keys,
# the fixture's logits, the vision and mtp tensors byte-identical (tests/fixtures/check_hf_load.py).
# Needs the fixture venv (torch + transformers: $MEGATRAIN_FIXENV, default
# ~/.cache/megatrain/fixenv); without it the test is skipped (exit 77), as on CI.
# Usage: test_hf_multimodal_load.sh MEGATRAIN_BIN SOURCE_DIR
set -euo pipefail
bin=$1
src=$2
py="${MEGATRAIN_FIXENV:-$HOME/.cache/megatrain/fixenv}/bin/python"
if [ ! -x "$py" ]; then
    echo "SKIP: no fixture venv at $py (torch + transformers)"
    exit 77
fi
fx="$src/tests/fixtures/qwen3_5_vl_mtp"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for dt in f32 bf16; do
    "$bin" convert --model "$fx" --out "$tmp/$dt" --dtype "$dt"
    cmp "$fx/config.json" "$tmp/$dt/config.json"
    "$py" "$src/tests/fixtures/check_hf_load.py" "$tmp/$dt" "$fx"
done
