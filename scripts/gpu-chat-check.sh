#!/usr/bin/env bash
# Chat fine-tuning data through the CUDA path (issue 5 on the GPU), on the GPU machine after
# scripts/gpu-test.sh built build-gpu (or with MT_BIN set): the fixture conversations
# (tests/fixtures/chat/cases.jsonl) rendered with the llama3 fixture tokenizer, packed with document
# starts and assistant-only loss, trained 6 steps from the same tiny model
#   A: on cuda from the .jsonl        B: on cpu from the .jsonl        C: on cuda from a packed file
#      made by `megatrain tokenize --chat`
# Pass: every step's loss of A within 2% of B's (bf16 against fp32 on a 2-layer model) and the two
# runs learn alike; A and C identical bit for bit (the same rows, masks and document starts reach
# the GPU either way). Writes $OUT/chat-check.log; exit 1 on a failure.
#   DEV=cpu scripts/gpu-chat-check.sh   runs A and C on the cpu instead (to check the script itself)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${MT_BIN:-build-gpu/megatrain}
dev=${DEV:-cuda}
out=${OUT:-/tmp}
log=$out/chat-check.log
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
python3 - "$w/cfg.json" <<'PY'
import json, sys
c = json.load(open("tests/fixtures/train_llama/config.json"))
c["vocab_size"] = 1536            # the llama3 fixture tokenizer's vocabulary
c["max_position_embeddings"] = 256
json.dump(c, open(sys.argv[1], "w"))
PY
"$bin" train --init "$w/cfg.json" --data tests/fixtures/train_llama/data.bin --steps 1 --batch 2 \
  --seq 16 --device cpu --out "$w/init" > "$w/init.log" 2>&1 || { cat "$w/init.log"; exit 1; }
model=$w/init/checkpoints/step_00000001
cp tests/fixtures/tokenizers/llama3/tokenizer.json tests/fixtures/tokenizers/llama3/tokenizer_config.json "$model/"
common="--model $model --steps 6 --batch 2 --seq 128 --no-shuffle --lr 1e-2 --warmup 0 --no-save"
{
  echo "# chat check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), device $dev"
  "$bin" train $common --data tests/fixtures/chat/cases.jsonl --device "$dev" --out "$w/a" 2>&1 | grep -E "packed|conversation|warning|step 6"
  "$bin" train $common --data tests/fixtures/chat/cases.jsonl --device cpu --out "$w/b" 2>&1 | grep -E "step 6"
  "$bin" tokenize --tokenizer "$model" --chat --seq 128 --out "$w/cases.packed" tests/fixtures/chat/cases.jsonl 2>&1 | tail -2
  "$bin" train $common --data "$w/cases.packed" --device "$dev" --out "$w/c" 2>&1 | grep -E "step 6"
} 2>&1 | tee "$log"
python3 - "$w" <<'PY' 2>&1 | tee -a "$log"
import json, sys
w = sys.argv[1]
def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{w}/{run}/metrics.jsonl") if '"loss"' in l]
a, b, c = losses("a"), losses("b"), losses("c")
ok = len(a) == len(b) == len(c) == 6
for i, (x, y, z) in enumerate(zip(a, b, c)):
    rel = abs(x - y) / y
    ok &= rel <= 2e-2 and x == z
    print(f"step {i + 1}: jsonl {x:.6f} (packed file {z:.6f}{'' if x == z else ' DIFFERS'}) vs cpu {y:.6f} rel {rel:.2e}")
ok &= a[-1] < a[0] and b[-1] < b[0]
print("CHAT CHECK", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
