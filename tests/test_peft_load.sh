#!/usr/bin/env bash
# PEFT loads the adapter a megatrain LoRA run saves, and the adapted model computes what megatrain
# computes: `megatrain train --adapter` on the lora_llama, lora_gpt_oss, lora_gpt_oss_experts, lora_gemma4 and
# lora_gemma4_moe fixtures
# (10 steps) and a multimodal gemma4_vl run, then PEFT's loss on the
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
eval_loss() { # the loss `megatrain eval --adapter DIR [--model BASE]` prints on the fixture's first batch
    "$bin" eval --model "${2:-$fx/base}" --adapter "$1" --data "$fx/data.bin" --batch 4 --seq "$seq" --batches 1 |
        sed -n 's/.*: loss \([0-9.]*\),.*/\1/p'
}
for name in lora_llama lora_gpt_oss lora_gpt_oss_experts lora_gemma4 lora_gemma4_moe; do
    fx="$src/tests/fixtures/$name"
    seq=$(sed -n 's/.*--seq \([0-9]*\).*/\1/p' "$fx/args.txt")
    (cd "$fx" && "$bin" train --model base --adapter adapter_init --out "$tmp/$name" --device cpu $(cat args.txt) >/dev/null)
    ckpt="$tmp/$name/checkpoints/step_00000010"
    "$py" "$src/tests/fixtures/check_peft_load.py" "$fx/base" "$ckpt" "$fx/reference.safetensors" "$(eval_loss "$ckpt")"
    "$py" "$src/tests/fixtures/check_peft_load.py" "$fx/base" "$fx/adapter_final" "$fx/reference.safetensors" \
        "$(eval_loss "$fx/adapter_final")"
done
# A multimodal checkpoint (gemma4_vl: Gemma4ForConditionalGeneration with a vision tower): megatrain's
# adapter names the language model's modules as PEFT does there (model.language_model.*) and its
# target_modules keep the vision tower out, so PeftModel.from_pretrained of the multimodal model takes
# it; 3 steps on lora_gemma4's data (its tokens are within gemma4_vl's vocabulary), compared on its batch.
fx="$src/tests/fixtures/lora_gemma4"
seq=24
vl="$src/tests/fixtures/gemma4_vl"
"$bin" train --model "$vl" --data "$fx/data.bin" --no-shuffle --steps 3 --batch 4 --seq "$seq" --lr 1e-2 \
    --device cpu --lora 4 --out "$tmp/gemma4_vl" >/dev/null
ckpt="$tmp/gemma4_vl/checkpoints/step_00000003"
"$py" "$src/tests/fixtures/check_peft_load.py" "$vl" "$ckpt" "$fx/reference.safetensors" "$(eval_loss "$ckpt" "$vl")"
echo "PASS"
