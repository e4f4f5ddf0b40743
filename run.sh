#!/usr/bin/env bash
# The main job on its built-in default: installs what is missing, builds, and trains a small
# Llama-family model from scratch on the Debian fortunes corpus (byte-level tokens) for about two
# minutes, evaluates it on a held-out fortune file, and prints a generated sample.
# Extra arguments go to `megatrain train` (e.g. ./run.sh --steps 20).
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh fortunes
# the CUDA backend only where a GPU can run it (test.sh compiles it wherever nvcc exists)
if nvidia-smi -L >/dev/null 2>&1; then scripts/build.sh build; bin=build/megatrain
else scripts/build.sh build-cpu -DMT_CUDA=OFF; bin=build-cpu/megatrain; fi
out=out/default
corpus=/usr/share/games/fortunes
mkdir -p "$out"
train_files=$(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name zippy | sort)
$bin tokenize --bytes --doc-sep % --out "$out/train.bin" $train_files
$bin tokenize --bytes --doc-sep % --out "$out/eval.bin" "$corpus/zippy"
$bin train --init configs/tiny-bytes.json --data "$out/train.bin" --eval-data "$out/eval.bin" \
  --out "$out/run" --steps 150 --batch 16 --seq 128 --lr 3e-3 --min-lr 3e-4 --warmup 10 \
  --eval-every 50 --eval-batches 4 --max-time 120 --seed 1 "$@"
latest=$(ls -d "$out"/run/checkpoints/step_* | sort | tail -n 1)
echo
echo "--- sample from $latest (top-k 20, temperature 0.8):"
$bin generate --model "$latest" --prompt "The " --tokens 400 --top-k 20 --temperature 0.8 --context 128 \
  --ignore-eos
