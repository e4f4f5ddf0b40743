#!/usr/bin/env bash
# The loss a quantized frozen base costs LoRA (issue 27, "loss gap of the base formats"), on the CPU:
# a small Llama-family model (configs/tiny-bytes.json, 3.4M parameters, byte tokens) is trained
# from scratch on the Debian fortunes corpus without its `computers` file, then fine-tuned with
# rank-16 LoRA on `computers` (a tenth of its fortunes held out: --eval-split 0.1) on each frozen
# base format: bf16 (the CPU computes in fp32: the base's own weights), fp8 (e4m3, a scale per 128)
# and nf4 (QLoRA's NormalFloat, an absmax per 64). Same data order, seed and schedule for the three;
# writes OUT/summary.txt (each run's final eval loss and its gap to bf16's) and a metrics.svg per run.
# Usage: bench/lora_base_formats.sh [BIN [OUT]]   (default build-cpu/megatrain, bench/lora-base-formats)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-cpu/megatrain}
out=${2:-bench/lora-base-formats}
corpus=/usr/share/games/fortunes
[ -d "$corpus" ] || scripts/deps.sh fortunes
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base_files=$(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name zippy ! -name computers | sort)
"$bin" tokenize --bytes --doc-sep % --out "$work/base.bin" $base_files >/dev/null
"$bin" train --init configs/tiny-bytes.json --data "$work/base.bin" --out "$work/pre" --steps 300 \
  --batch 16 --seq 128 --lr 3e-3 --min-lr 3e-4 --warmup 10 --seed 1 --no-tensorboard > "$work/pre.log"
pre=$(find "$work/pre/checkpoints" -maxdepth 1 -name 'step_*' | sort | tail -n 1)
cp "$corpus/computers" "$work/computers.txt"
{
  echo "# LoRA rank 16 on the frozen tiny-bytes model ($(basename "$pre") of 300 pretraining steps),"
  echo "# 120 steps of 16 x 128 bytes on fortunes' computers file, eval on its held-out tenth"
  echo "# $(date -u +%Y-%m-%d) commit $(git rev-parse --short HEAD) $(uname -m), $(nproc) cores"
} > "$out/summary.txt"
for f in bf16 fp8 nf4; do
  "$bin" train --model "$pre" --lora 16 --base-dtype "$f" --data "$work/computers.txt" --eval-split 0.1 \
    --doc-sep % --out "$work/lora_$f" --steps 120 --batch 16 --seq 128 --lr 2e-3 --min-lr 2e-4 --warmup 10 \
    --eval-every 20 --eval-batches 8 --seed 3 --no-tensorboard > "$work/lora_$f.log"
  "$bin" plot --out "$out/metrics-$f.svg" "$work/lora_$f" >/dev/null
  cp "$work/lora_$f/metrics.jsonl" "$out/metrics-$f.jsonl"
  # the last evaluation's loss at metrics.jsonl's full precision (the step line rounds to 4 digits)
  loss=$(grep '"eval_loss"' "$out/metrics-$f.jsonl" | tail -n 1 | sed 's/.*"eval_loss": \([0-9.]*\).*/\1/')
  first=$(head -n 1 "$out/metrics-$f.jsonl" | sed 's/.*"loss": \([0-9.]*\),.*/\1/')
  echo "$f $loss $first" >> "$work/losses"
done
awk 'NR == 1 { ref = $2; ref1 = $3 }
     { printf "%-5s final eval loss %s (%+.3f%% vs bf16); first step loss %s (%+.3f%%)\n", $1, $2,
       100 * ($2 - ref) / ref, $3, 100 * ($3 - ref1) / ref1 }' \
  "$work/losses" | tee -a "$out/summary.txt"
