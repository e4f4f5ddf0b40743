#!/usr/bin/env bash
# PEFT loads the adapter a megatrain LoRA run saves, and the adapted model computes what megatrain
# computes: `megatrain train --adapter` on the lora_llama and lora_gpt_oss fixtures (10 steps), then PEFT's loss on the
# fixture's batch against `megatrain eval --adapter` of the same checkpoint (1e-5,
# tests/fixtures/check_peft_load.py); and PEFT's own trained adapter (adapter_final) through
# `megatrain eval --adapter` against the loss of the fixture's logits (PEFT's adapted model, not a
# merge). Needs the fixture venv (torch + transformers + peft: $MEGATRAIN_FIXENV, default
# ~/.cache/megatrain/fixenv); without it the test is skipped (exit 77), as on CI.
# Usage: test_peft_load.sh MEGATRAIN_BIN SOURCE_DIR
set -euo pipefail
bin=$1
src=$2
py="${MEGATRAIN_FIXENV:-$HOME/.cache/megatrain/fixenv}/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import peft" 2>/dev/null; then
    echo "SKIP: no fixture venv with peft at $py"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
eval_loss() { # the loss `megatrain eval --adapter DIR` prints on the fixture's first batch
    "$bin" eval --model "$fx/base" --adapter "$1" --data "$fx/data.bin" --batch 4 --seq "$seq" --batches 1 |
        sed -n 's/.*: loss \([0-9.]*\),.*/\1/p'
}
for name in lora_llama lora_gpt_oss; do
    fx="$src/tests/fixtures/$name"
    seq=$(sed -n 's/.*--seq \([0-9]*\).*/\1/p' "$fx/args.txt")
    (cd "$fx" && "$bin" train --model base --adapter adapter_init --out "$tmp/$name" --device cpu $(cat args.txt) >/dev/null)
    ckpt="$tmp/$name/checkpoints/step_00000010"
    "$py" "$src/tests/fixtures/check_peft_load.py" "$fx/base" "$ckpt" "$fx/reference.safetensors" "$(eval_loss "$ckpt")"
    "$py" "$src/tests/fixtures/check_peft_load.py" "$fx/base" "$fx/adapter_final" "$fx/reference.safetensors" \
        "$(eval_loss "$fx/adapter_final")"
done
echo "PASS"
