#!/usr/bin/env bash
# On the GPU machine (no Python, no network), from the repository root, with $OUT set (one device
# call; carry third_party/debs and bench/accuracy/data/corpus.tar.xz): builds build-gpu/ when
# missing (scripts/gpu-test.sh build), makes the token files from the archive when missing, runs
#   bench/accuracy/run.sh --profile big ARGS...
# and copies the summary, the curves and each format's metrics/eval/log tail to $OUT/accuracy/.
# The machine keeps build-gpu/ and bench/accuracy/{data,runs}/ while it stays warm, so a second call
# with the same ARGS resumes the runs that --max-time stopped.
#   bench/accuracy/gpu.sh --parallel --max-time 480 full compact tight
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT/accuracy"
[ -x build-gpu/megatrain ] || OUT=$OUT/accuracy bash scripts/gpu-test.sh build >/dev/null
multi=$(ls -d "${MT_DEPS:-/tmp/mtdeps}"/usr/lib/*-linux-gnu | head -1)
export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MT=$PWD/build-gpu/megatrain
A=bench/accuracy
[ -f $A/data/train.bin ] && [ -f $A/data/eval.bin ] || $A/prepare.sh --from-archive $A/data/corpus.tar.xz
rc=0
$A/run.sh --profile big "$@" || rc=$?
R=$A/runs/big
cp $R/summary.md $R/*.svg "$OUT/accuracy/" 2>/dev/null || true
for d in $R/*/; do
    f=$(basename "$d")
    cp "$d/metrics.jsonl" "$OUT/accuracy/$f.metrics.jsonl" 2>/dev/null || true
    { cat "$d/final_eval.txt" 2>/dev/null; tail -25 "$d/train.log"; } >"$OUT/accuracy/$f.log" 2>/dev/null || true
done
exit $rc
