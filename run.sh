#!/usr/bin/env bash
# The main job on its built-in default: installs what is missing, builds, and trains a small
# Llama-family model from scratch on the Debian fortunes corpus (byte-level tokens) for about two
# minutes, evaluates it on a held-out fortune file, and prints a generated sample.
# Each run is a fresh demo run: it trains into out/default/run with --overwrite (the previous
# run's metrics.jsonl and checkpoints there are replaced; train refuses a used --out without it)
# and samples from the checkpoint this run wrote.
# Extra arguments go to `megatrain train` (e.g. ./run.sh --steps 20; with --resume the run in
# out/default/run is continued instead of replaced).
set -euo pipefail
cd "$(dirname "$0")"
out=out/default
echo "run.sh: outputs go to $out/ (checkpoints in $out/run/checkpoints/, metrics in" \
  "$out/run/metrics.jsonl); it takes about 2.5 minutes: at most 2 of training (--max-time 120)," \
  "then an evaluation and a sample; on a fresh machine first the packages and a build (~1 minute)"
scripts/deps.sh fortunes
# the CUDA backend only where a GPU can run it (test.sh compiles it wherever nvcc exists)
if nvidia-smi -L >/dev/null 2>&1; then scripts/build.sh build; bin=build/megatrain
else scripts/build.sh build-cpu -DMT_CUDA=OFF; bin=build-cpu/megatrain; fi
corpus=/usr/share/games/fortunes
mkdir -p "$out"
train_files=$(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name zippy | sort)
$bin tokenize --bytes --doc-sep % --out "$out/train.bin" $train_files
$bin tokenize --bytes --doc-sep % --out "$out/eval.bin" "$corpus/zippy"
# a fresh run replaces the last one; --resume (given by the user) continues it instead
fresh=--overwrite
for a in "$@"; do [[ $a == --resume ]] && fresh=; done
$bin train --init configs/tiny-bytes.json --data "$out/train.bin" --eval-data "$out/eval.bin" \
  --out "$out/run" --steps 150 --batch 16 --seq 128 --lr 3e-3 --min-lr 3e-4 --warmup 10 \
  --eval-every 50 --eval-batches 4 --max-time 120 --seed 1 $fresh "$@"
# --overwrite removed the previous run's checkpoints, so the newest one is this run's
latest=$(find "$out/run/checkpoints" -maxdepth 1 -name 'step_*' -type d 2>/dev/null | sort | tail -n 1)
if [[ -z $latest ]]; then
  echo "run.sh: this run wrote no checkpoint (--no-save?), so there is nothing to sample from"
  exit 0
fi
echo
echo "--- sample from $latest (top-k 20, temperature 0.8):"
$bin generate --model "$latest" --prompt "The " --tokens 400 --top-k 20 --temperature 0.8 --context 128 \
  --ignore-eos
echo
echo "run.sh: the model is $latest (a Hugging Face directory: config.json + model.safetensors),"
echo "        the step and eval losses are in $out/run/metrics.jsonl;"
echo "        draw them with: $bin plot $out/run   (writes $out/run/metrics.svg)"
