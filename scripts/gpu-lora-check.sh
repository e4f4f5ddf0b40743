#!/usr/bin/env bash
# On the GPU machine: the LoRA GPU checks and the issue's side-by-side (issue 27), in stages so that
# each device call stays under its 600 s (a warm machine keeps build-gpu/ between calls):
#   scripts/gpu-lora-check.sh STAGE...    e.g.  build tests mt8:bf16 mt8:nf4 full8 peer:bf16
# Stages:
#   build        scripts/gpu-test.sh build (carry third_party/debs and third_party/cudnn-frontend)
#   tests        test_cuda_lora (the LoRA ops, NULL weight gradients, dequantization, whole runs)
#   ops          test_cuda_ops
#   mt8:BASE     megatrain LoRA rank 16 on the Llama-3.1-8B shape, 16 x 4096 a step, base BASE
#   full8        megatrain full-parameter on the same shape and batch (LoRA vs full)
#   peer:BASE[:CFG]  bench/peft_lora_bench.py (CFG a bench/configs name, default llama-3.1-8b) (PEFT + transformers, gradient checkpointing, 4 x 4
#                accumulated), base bf16 or nf4 (bitsandbytes); carry third_party/wheels with the
#                peft and bitsandbytes wheels (scripts/peer-wheels.sh).
#                peer:BASE:CFG:TARGETS[:PARAMS]: PEFT's module list and target_parameters (gpt-oss:
#                peer:bf16:gpt-oss-20b:q_proj,k_proj,v_proj,o_proj:mlp.experts.gate_up_proj,mlp.experts.down_proj);
#                PEER_MICRO sets its micro-batch (default 4)
#   mt70:BASE    the Llama-3.3-70B shape, rank 16, base BASE, 8 x 4096 a step (no peer fits)
#   q36:BASE     the Qwen3.6-35B-A3B shape (Gated DeltaNet + MoE), rank 16, base BASE, 8 x 4096
#   t:NAME[:FILTER]  the GPU test NAME (MT_TEST_FILTER=FILTER where the test takes one)
#   qwen35model  test_cuda_model's test_qwen3_5_models (issue 26: whole Qwen3.5 models, CUDA vs CPU)
#   fp8gemm      bench/fp8_gemm_bench.cu: bf16 against block-scaled fp8 cuBLASLt GEMMs
#   gdbench      test_cuda_gated_delta --bench with MT_GATED_DELTA_PROFILE=1 (the DeltaNet kernel's
#                time by kernel, split and plain TF32)
#   gdncu        Nsight Compute on the first launch of each DeltaNet kernel (B 1, T 4096): stall reasons
#   lora:CFG:BASE[:BATCH[:TARGETS]]  LoRA rank 16 on bench/configs/CFG.json, base BASE, BATCH x 4096
#                (8), 3 steps; TARGETS a --lora-targets list (commas)
#   full:CFG:STATE[:BATCH[:EXTRA]]  full-parameter on bench/configs/CFG.json, --state STATE,
#                3 steps; EXTRA more train flags, commas for spaces (e.g. --update-on,gpu)
#   adamw:CFG:STATE  bench adamw --pattern training on the GPU machine: the host update, then
#                --update-on gpu's streamed one, of CFG's state
#   cut:CFG:LAYERS:STATE[:BATCH[:EXTRA]]  full-parameter on CFG cut to its first LAYERS layers, 3 steps,
#                with --trace (trace-CFG-LAYERS.json): where a new family's step goes, cheaply
#   oldfull:CFG:STATE[:BATCH]  full: with MT_OLD_BIN's megatrain (a baseline build, carried beside)
#   long:CFG:SEQ:STATE      full-parameter, one row of SEQ tokens a step, 2 steps (long context)
#   env:NAME=VALUE  exports NAME=VALUE for the stages after it (e.g. env:MT_GATED_DELTA_BWD=gemm)
#   moebench[:ONLY]  bench/moe_bench.cu --iters 3 (--only qwen3|mixtral, or quick: --quick): the MoE block by piece,
#                the experts' GEMMs loop against grouped
# MT_BIN=DIR runs the binaries built here in DIR (scripts/gpu-prebuilt.sh says how; carry DIR's
# megatrain and test binaries and MT_DEBS, default third_party/debs-run) instead of building there.
# Every run is bounded by `timeout` (a megatrain run by MT_LIMIT, default 400 s) and by the call's budget: BUDGET seconds (default 570) from the
# script's start, less a 15 s margin. Logs in $OUT (lora.log is the summary).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/lora.log
say() { echo "$*" | tee -a "$log"; }
: > "$log"
export PATH=/usr/local/cuda/bin:$PATH
start=$(date +%s)
budget=${BUDGET:-570}
left() { # the seconds a step may take: min(ITS_LIMIT, what the call has left less 15)
  local l=$((budget - ($(date +%s) - start) - 15))
  [ "$l" -gt "$1" ] && l=$1
  [ "$l" -lt 1 ] && l=1
  echo "$l"
}
. scripts/gpu-build-step.sh
stamp() { say "   [$(( $(date +%s) - start )) s]"; }

tokens_for() { # CONFIG: random tokens of its vocabulary (uint16 or uint32 as megatrain reads them)
  local vocab
  vocab=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('vocab_size') or c.get('text_config',{}).get('vocab_size'))" "$1")
  tokens=/tmp/tokens_$vocab.bin
  [ -f "$tokens" ] || python3 bench/make_tokens.py "$vocab" $((4 * 16 * 4096 + 1)) "$tokens"
}

run_mt() { # NAME CONFIG STEPS BATCH EXTRA...: the first step warms up; the step lines are kept
  local name=$1 cfg=$2 steps=$3 batch=$4 t0
  shift 4
  tokens_for "$cfg"
  say "== megatrain $name ($*)"
  t0=$(date +%s)
  timeout "$(left "${MT_LIMIT:-400}")" "$bin/megatrain" train --init "$cfg" --data "$tokens" --out "/tmp/mt-lora-$name" \
    --overwrite --steps "$steps" --batch "$batch" --seq 4096 --no-save --no-tensorboard "$@" \
    > "$OUT/mt-$name.log" 2>&1
  say "rc $? in $(( $(date +%s) - t0 )) s"
  grep -E "LoRA|base|memory plan|GPU |host|step [0-9]+/|summary|throughput|error" "$OUT/mt-$name.log" | tail -30 | tee -a "$log"
}

run_peer() { # BASE [CONFIG [TARGETS [PARAMETERS]]]
  local cfg=${2:-llama-3.1-8b} targets=${3:-} params=${4:-}
  say "== peer: PEFT $1 on $cfg"
  local site=/tmp/peer-site t0
  if [ ! -d $site ]; then
    mkdir -p $site
    for w in third_party/wheels/*.whl; do python3 -m zipfile -e "$w" $site; done
  fi
  t0=$(date +%s)
  PYTHONPATH=$site timeout "$(left 400)" python3 bench/peft_lora_bench.py --config "bench/configs/$cfg.json" \
    --base "$1" --rank 16 --batch 16 --micro-batch "${PEER_MICRO:-4}" --seq 4096 --steps 2 \
    ${targets:+--targets $targets} ${params:+--target-parameters $params} > "$OUT/peer-$1-$cfg.log" 2>&1
  say "rc $? in $(( $(date +%s) - t0 )) s"
  grep -E "^step|^peft|Error|error" "$OUT/peer-$1-$cfg.log" | tail -6 | tee -a "$log"
}

bin=${MT_BIN:-build-gpu}
built=0
ensure_built() {
  [ $built -eq 1 ] && return
  if [ -n "${MT_BIN:-}" ]; then
    MT_DEBS=${MT_DEBS:-third_party/debs-run} scripts/gpu-prebuilt.sh true || exit 1
    multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
    export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
    export MT_FIXTURES=$PWD/tests/fixtures # the tests' compiled-in path is this machine's
  elif [ -x build-gpu/megatrain ] && [ -d /tmp/mtdeps ]; then
    multi=$(ls -d /tmp/mtdeps/usr/lib/*-linux-gnu | head -1)
    export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
  else
    gpu_build_step lora
  fi
  built=1
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$log"
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') stages: $*"
for stage in "$@"; do
  case $stage in
    build) gpu_build_step lora; built=0; ensure_built ;;
    tests|ops)
      ensure_built
      t=test_cuda_lora; [ "$stage" = ops ] && t=test_cuda_ops
      say "== $t"
      timeout "$(left "${TEST_LIMIT:-300}")" "$bin/$t" > "$OUT/$t.log" 2>&1
      say "rc $? ($(grep -c '\[       OK \]' "$OUT/$t.log") OK, $(grep -c '\[  FAILED  \]' "$OUT/$t.log") FAILED lines)"
      grep -E "FAILED|fail|error" "$OUT/$t.log" | head -20 | tee -a "$log"
      tail -n 15 "$OUT/$t.log" | tee -a "$log" ;;
    t:*)
      ensure_built
      t=${stage#t:}; f=""
      case $t in *:*) f=${t#*:}; t=${t%%:*} ;; esac
      say "== $t ${f:+(filter $f)}"
      MT_TEST_FILTER=$f timeout "$(left "${TEST_LIMIT:-300}")" "$bin/$t" > "$OUT/$t${f:+-$f}.log" 2>&1
      say "rc $? ($(grep -c '\[       OK \]' "$OUT/$t${f:+-$f}.log") OK, $(grep -c '\[  FAILED  \]' "$OUT/$t${f:+-$f}.log") FAILED lines)"
      grep -E "FAIL|error" "$OUT/$t${f:+-$f}.log" | head -12 | tee -a "$log" ;;
    q36:*) ensure_built; run_mt "q36-lora-${stage#q36:}" bench/configs/qwen3.6-35b-a3b.json 2 8 --lora 16 --base-dtype "${stage#q36:}" ;;
    mt8:*) ensure_built; run_mt "8b-lora-${stage#mt8:}" bench/configs/llama-3.1-8b.json 3 16 --lora 16 --base-dtype "${stage#mt8:}" ;;
    full8) ensure_built; run_mt 8b-full bench/configs/llama-3.1-8b.json 3 16 ;;
    peer:*) ensure_built; IFS=: read -r _ pbase pcfg ptargets pparams <<< "$stage"; run_peer "$pbase" "$pcfg" "$ptargets" "$pparams" ;;
    qwen35model)
      ensure_built
      say "== test_cuda_model test_qwen3_5_models"
      MT_TEST_FILTER=test_qwen3_5_models timeout "$(left "${TEST_LIMIT:-300}")" "$bin/test_cuda_model" > "$OUT/qwen35-model.log" 2>&1
      say "rc $?"
      grep -E "^---|FAIL|PASSED|FAILED|OK \]" "$OUT/qwen35-model.log" | head -40 | tee -a "$log" ;;
    fp8gemm)
      ensure_built
      say "== fp8_gemm_bench"
      timeout "$(left 120)" "$bin/fp8_gemm_bench" > "$OUT/fp8-gemm.log" 2>&1
      say "rc $?"; cat "$OUT/fp8-gemm.log" | tee -a "$log" ;;
    gdbench)
      ensure_built
      say "== test_cuda_gated_delta --bench (profiled)"
      MT_GATED_DELTA_PROFILE=1 timeout "$(left 200)" "$bin/test_cuda_gated_delta" --bench > "$OUT/gdbench.log" 2>&1
      say "rc $?"; grep -E "^B=|bench" "$OUT/gdbench.log" | tee -a "$log" ;;
    gdncu)
      ensure_built
      ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
      if [ -z "$ncu" ]; then say "no ncu on this machine"; else
        say "== ncu on the gated delta kernels"
        timeout "$(left 150)" "$ncu" -k regex:gd_ --launch-count 7 --section SpeedOfLight --section Occupancy \
          --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis \
          "$bin/test_cuda_gated_delta" --bench > "$OUT/gdncu.log" 2>&1
        say "rc $?"; grep -E "gd_|Duration|Warp Cycles Per Issued|Achieved Occupancy|Stall|Compute \(SM\) Throughput|Memory Throughput" "$OUT/gdncu.log" | head -80 | tee -a "$log"
      fi ;;
    lora:*)
      ensure_built
      IFS=: read -r _ cfg base batch targets <<< "$stage"
      run_mt "lora-$cfg-$base${targets:+-targets}" "bench/configs/$cfg.json" 3 "${batch:-8}" --lora 16 --base-dtype "$base" ${targets:+--lora-targets $targets} ;;
    full:*)
      ensure_built
      IFS=: read -r _ cfg state batch extra <<< "$stage"
      run_mt "full-$cfg-$state${extra:+-x}" "bench/configs/$cfg.json" 3 "${batch:-8}" ${state:+--state $state} ${extra//,/ } ;;
    cut:*)
      ensure_built
      IFS=: read -r _ cfg layers state batch extra <<< "$stage"
      python3 - "bench/configs/$cfg.json" "$layers" "/tmp/cut-$cfg-$layers.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); n = int(sys.argv[2])
t = c.get("text_config", c)
t["num_hidden_layers"] = n
if "layer_types" in t: t["layer_types"] = t["layer_types"][:n]
json.dump(c, open(sys.argv[3], "w"))
PY
      run_mt "cut-$cfg-$layers${extra:+-x}" "/tmp/cut-$cfg-$layers.json" 3 "${batch:-1}" ${state:+--state $state} \
        --trace "$OUT/trace-$cfg-$layers.json" ${extra//,/ } ;;
    oldfull:*) # the same with MT_OLD_BIN's megatrain (the baseline, side by side)
      ensure_built
      IFS=: read -r _ cfg state batch <<< "$stage"
      bin=$MT_OLD_BIN run_mt "oldfull-$cfg-$state" "bench/configs/$cfg.json" 3 "${batch:-8}" ${state:+--state $state} ;;
    long:*)
      ensure_built
      IFS=: read -r _ cfg seq state <<< "$stage"
      run_mt "long-$cfg-$seq" "bench/configs/$cfg.json" 2 1 --seq "$seq" ${state:+--state $state} ;;
    moebench|moebench:*)
      ensure_built
      say "== moe_bench --iters 3 ${stage#moebench}"
      a=${stage#moebench}; a=${a#:}
      # the routing's row kernels, new and old, side by side; MT_OLD_BIN: an older build's too
      for rk in vector scalar ${MT_OLD_BIN:+old}; do
        b2=$bin; [ "$rk" = old ] && b2=$MT_OLD_BIN
        say "-- $rk ($b2/moe_bench)"
        MT_MOE_ROW_KERNELS=$rk timeout "$(left 200)" "$b2/moe_bench" --iters 3 $([ "$a" = quick ] && echo --quick || echo ${a:+--only $a}) > "$OUT/moe-bench-$rk.log" 2>&1
        say "rc $?"; grep -E "^==|gather|combine|group|total|forward \+ backward|mt_moe_|all expert GEMMs|dweight|FAIL|megatrain:" "$OUT/moe-bench-$rk.log" | tee -a "$log"
      done ;;
    adamw:*) # the host groups' update alone: on the host, then streamed through the GPU (--update-on gpu)
      ensure_built
      IFS=: read -r _ cfg state <<< "$stage"
      for u in host gpu; do
        say "== bench adamw --pattern training $cfg --state $state --update-on $u"
        timeout "$(left 200)" "$bin/megatrain" bench adamw --pattern training --model "bench/configs/$cfg.json" \
          --device cuda --grad bf16 --state "$state" --reps 3 --update-on $u > "$OUT/adamw-$cfg-$state-$u.log" 2>&1
        say "rc $?"; tail -n 3 "$OUT/adamw-$cfg-$state-$u.log" | tee -a "$log"
      done ;;
    mt70:*) ensure_built; run_mt "70b-lora-${stage#mt70:}" bench/configs/llama-3.3-70b.json 2 8 --lora 16 --base-dtype "${stage#mt70:}" ;;
    env:*) export "${stage#env:}"; say "== env ${stage#env:}" ;;
    *) say "unknown stage $stage"; exit 2 ;;
  esac
  stamp
done
free -g | tee -a "$log"
