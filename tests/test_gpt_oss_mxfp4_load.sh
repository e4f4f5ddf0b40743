#!/usr/bin/env bash
# transformers loads what megatrain writes of an MXFP4 gpt-oss checkpoint (the fixture gpt_oss_mxfp4):
# `megatrain convert` to bf16 and fp32 writes the experts plain ([E, in, out]) and a config.json without
# quantization_config, which GptOssForCausalLM.from_pretrained loads as a plain (dequantized) gpt-oss with
# no missing or unexpected keys and the logits of the MXFP4 original dequantized by transformers
# (tests/fixtures/check_hf_load.py: max|got-ref|/max|ref| <= 1e-5; the dequantized values are exact in bf16).
# Needs the fixture venv (torch + transformers: $MEGATRAIN_FIXENV, default ~/.cache/megatrain/fixenv);
# without it the test is skipped (exit 77), as on CI.
# Usage: test_gpt_oss_mxfp4_load.sh MEGATRAIN_BIN SOURCE_DIR
set -euo pipefail
bin=$1
src=$2
py="${MEGATRAIN_FIXENV:-$HOME/.cache/megatrain/fixenv}/bin/python"
if [ ! -x "$py" ]; then
    echo "SKIP: no fixture venv at $py (torch + transformers)"
    exit 77
fi
fx="$src/tests/fixtures/gpt_oss_mxfp4"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -q '"quant_method": "mxfp4"' "$fx/config.json"
for dt in bf16 f32; do
    "$bin" convert --model "$fx" --out "$tmp/$dt" --dtype "$dt"
    if grep -q quantization_config "$tmp/$dt/config.json"; then
        echo "FAIL: $tmp/$dt/config.json keeps quantization_config"
        exit 1
    fi
    "$py" "$src/tests/fixtures/check_hf_load.py" "$tmp/$dt" "$fx"
done
