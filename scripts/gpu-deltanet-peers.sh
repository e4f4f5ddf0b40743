#!/usr/bin/env bash
# On the GPU machine, in one device call (carry third_party/debs, third_party/cudnn-frontend and
# third_party/wheels: flash-linear-attention, fla-core and einops wheels from PyPI): megatrain's
# chunked gated delta rule (test_cuda_gated_delta --bench) and its peers (bench/fla_gated_delta_bench.py:
# flash-linear-attention's Triton kernel, transformers' PyTorch chunked rule) at the same shape.
# MT_PREBUILT=1: run build/test_cuda_gated_delta as built here and carried (scripts/gpu-prebuilt.sh;
# carry third_party/debs and build/test_cuda_gated_delta) instead of building build-gpu there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/peers.log
say() { echo "$*" | tee -a "$log"; }
: > "$log"
export PATH=/usr/local/cuda/bin:$PATH
if [ -n "${MT_PREBUILT:-}" ]; then
  mt="scripts/gpu-prebuilt.sh build/test_cuda_gated_delta"
else
  . scripts/gpu-build-step.sh
  gpu_build_step peers
  mt=build-gpu/test_cuda_gated_delta
fi
say "== megatrain (test_cuda_gated_delta --bench)"
timeout 150 $mt --bench 2>&1 | grep -E "gated_delta|T=" | tee -a "$log"
say "== peers (bench/fla_gated_delta_bench.py)"
site=/tmp/peer-site; rm -rf $site; mkdir -p $site
for w in third_party/wheels/*.whl; do python3 -m zipfile -e "$w" $site; done
PYTHONPATH=$site timeout 200 python3 bench/fla_gated_delta_bench.py 2>&1 | grep -v Warning | tail -20 | tee -a "$log"
say "== transformers' torch_chunk_gated_delta_rule (without fla on the path)"
timeout 120 python3 bench/fla_gated_delta_bench.py --transformers 2>&1 | grep -v Warning | tail -5 | tee -a "$log"
