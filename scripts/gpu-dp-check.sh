#!/usr/bin/env bash
# Data parallel on the GPUs of one host (issue 13), after scripts/gpu-test.sh has built build-gpu/
# (with MPI and NCCL: its output says "nccl comm: yes"):
#   scripts/gpu-dp-check.sh [--dry] [SHAPE...]     SHAPE: 1.5b, 7b (default both), 3b, 14b
# For each shape and each N in NPS (default "1 2 4", cut to the GPUs visible): `mpirun -np N
# megatrain train --device cuda` (N = 1: no mpirun) at BATCH_PER_GPU sequences of SEQ tokens per
# GPU (the global --batch is N x that: weak scaling, the issue's "same global batch per GPU"),
# STEPS steps, --no-save. One RESULT line each, into $OUT/dp.log:
#   ms (median step time after the first), tok_s (global tokens/s), eff = tok_s / (N x tok_s at
#   N = 1) (the goal: >= 0.95 at N = 2, >= 0.925 at N = 4), rss_gib (each rank's peak RSS from
#   /usr/bin/time -v: it should fall as 1/N of the state plus each rank's fixed part), h2d/d2h GB/s
#   and gpu_busy of rank 0 (its step lines).
# Then exactness on the first shape (EXACT_STEPS, default 4, at a small global batch EXACT_BATCH x
# EXACT_SEQ): N = 1 against N = 2 on the same global batch — expect the losses NOT bit-equal (the
# ranks' fp32 partial gradients are summed by NCCL, not in one rank's micro-batch order) but within
# bf16 tolerance, 1e-2 relative, typically ~1e-3; the script prints both columns and the largest
# relative difference. And N = 2 resumed (--stop-at EXACT_STEPS/2, --resume) against uninterrupted:
# expect the same printed bits and the same checkpoint bytes (NCCL's sums are deterministic for a
# fixed topology, count and NCCL version); it prints "bit-identical: yes/no".
# --dry: the same phases on the CPU backend (build-cpu/megatrain, --device cpu, mpirun
# --oversubscribe), the tiny configs/tiny-bytes.json model and NPS "1 2": checks the script itself on
# a machine without GPUs in about a minute.
# Env: OUT (/tmp/mt-out), NPS, STEPS (6), BATCH_PER_GPU (8), SEQ (4096), EXACT_STEPS (4),
# EXACT_BATCH (4), EXACT_SEQ (1024), FLAGS (extra train flags), MT_BIN. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0, the machines' notes).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dry=0
if [ "${1:-}" = "--dry" ]; then dry=1; shift; fi
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/dp.log
export NCCL_NVLS_ENABLE=0
STEPS=${STEPS:-6}
EXACT_STEPS=${EXACT_STEPS:-4}
FLAGS=${FLAGS:-}
if [ $dry = 1 ]; then
  bin=${MT_BIN:-build-cpu/megatrain}
  device=cpu
  NPS=${NPS:-1 2}
  BATCH_PER_GPU=${BATCH_PER_GPU:-2}
  SEQ=${SEQ:-64}
  EXACT_BATCH=${EXACT_BATCH:-4}
  EXACT_SEQ=${EXACT_SEQ:-64}
  shapes=${*:-tiny}
  gpus=2
  mpi_extra="--oversubscribe -x OMP_NUM_THREADS=1"
else
  bin=${MT_BIN:-build-gpu/megatrain}
  device=cuda
  NPS=${NPS:-1 2 4}
  BATCH_PER_GPU=${BATCH_PER_GPU:-8}
  SEQ=${SEQ:-4096}
  EXACT_BATCH=${EXACT_BATCH:-4}
  EXACT_SEQ=${EXACT_SEQ:-1024}
  shapes=${*:-1.5b 7b}
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  mpi_extra=""
  multi=$(ls -d "${MT_DEPS:-/tmp/mtdeps}"/usr/lib/*-linux-gnu 2>/dev/null | head -1) # gpu-test.sh's libraries
  [ -n "$multi" ] && export LD_LIBRARY_PATH="$multi:$multi/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[ -x "$bin" ] || { echo "gpu-dp-check: $bin is not built" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "gpu-dp-check: no mpirun (apt-get install openmpi-bin)" >&2; exit 1; }
say() { echo "$@" | tee -a "$log"; }
say "# gpu-dp-check ${*:-} (dry $dry) $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null), $gpus GPUs$([ $dry = 1 ] && echo ' (dry: CPU ranks)')"
free -g | head -2 | tee -a "$log"

config() { # shape -> its config.json
  if [ "$1" = tiny ]; then echo configs/tiny-bytes.json; else echo "bench/configs/qwen2.5-$1.json"; fi
}

tokens() { # vocab count -> a token file (made once)
  local f=/tmp/dp_tokens_$1_$2.bin
  # random ids, uint16 when the vocabulary fits (as bench/make_tokens.py, without numpy)
  [ -f "$f" ] || python3 - "$1" "$2" "$f" <<'EOF'
import array, random, sys
vocab, count = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(0)
array.array("H" if vocab <= 65536 else "I", (rng.randrange(vocab) for _ in range(count))).tofile(open(sys.argv[3], "wb"))
EOF
  echo "$f"
}

vocab() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$1"; }

# launch N name args...: N ranks (1: no mpirun), each under /usr/bin/time -v into $OUT/time.NAME.R
launch() {
  local n=$1 name=$2; shift 2
  rm -f "$OUT"/time."$name".*
  if [ "$n" = 1 ]; then
    /usr/bin/time -v -o "$OUT/time.$name.0" "$bin" "$@"
  else
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root -np "$n" $mpi_extra -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
      sh -c '/usr/bin/time -v -o "'"$OUT"'/time.'"$name"'.$OMPI_COMM_WORLD_RANK" "$0" "$@"' "$bin" "$@"
  fi
}

rss_list() { # name -> "r0/r1/..." peak RSS in GiB
  local f out=""
  for f in $(ls "$OUT"/time."$1".* 2>/dev/null | sort -t. -k3 -n); do
    out="$out${out:+/}$(awk '/Maximum resident set size/ { printf "%.2f", $6 / 1048576 }' "$f")"
  done
  echo "${out:-?}"
}

median() { # metrics.jsonl key -> the median after the first step
  python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
rest = rows[1:] or rows
vals = [r[sys.argv[2]] for r in rest if sys.argv[2] in r]
print("%.6g" % statistics.median(vals) if vals else "nan")
EOF
}

scaling() { # shape
  local shape=$1 cfg; cfg=$(config "$1")
  local v; v=$(vocab "$cfg")
  local base=""
  for n in $NPS; do
    if [ "$n" -gt "$gpus" ]; then say "## $shape N=$n: skipped, $gpus GPUs"; continue; fi
    local B=$((n * BATCH_PER_GPU)) name="scale-$shape-np$n" run=/tmp/dp-run-$shape-np$n
    local data; data=$(tokens "$v" $(( (STEPS + 1) * B * SEQ + 1 )))
    say "## $name: $shape, $n rank(s), global batch $B x $SEQ, $STEPS steps $FLAGS"
    # shellcheck disable=SC2086
    launch "$n" "$name" train --init "$cfg" --data "$data" --out "$run" --overwrite --steps "$STEPS" \
      --batch "$B" --seq "$SEQ" --no-shuffle --device "$device" --no-save --warmup 1 $FLAGS \
      > "$OUT/dp-$name.out" 2>&1
    local rc=$?
    grep -E "^(micro-batch|optimizer state|memory plan|host RAM|data parallel|training|step )" "$OUT/dp-$name.out" | tee -a "$log"
    [ $rc -eq 0 ] || { say "failed (rc $rc):"; tail -5 "$OUT/dp-$name.out" | tee -a "$log"; continue; }
    local ms tok h2d d2h busy eff
    ms=$(median "$run/metrics.jsonl" ms)
    tok=$(median "$run/metrics.jsonl" tok_s)
    h2d=$(median "$run/metrics.jsonl" h2d_gbs)
    d2h=$(median "$run/metrics.jsonl" d2h_gbs)
    busy=$(median "$run/metrics.jsonl" gpu_busy)
    [ "$n" = 1 ] && base=$tok
    eff=$(python3 -c "import sys; b, t, n = sys.argv[1:]; print('%.3f' % (float(t) / (int(n) * float(b))) if b else 'nan')" "$base" "$tok" "$n")
    say "RESULT dp shape=$shape np=$n batch=$B seq=$SEQ ms=$ms tok_s=$tok eff=$eff rss_gib=$(rss_list "$name") h2d_gbs=$h2d d2h_gbs=$d2h gpu_busy=$busy"
  done
}

losses() { # run dir -> "loss grad_norm" per step, as printed
  python3 - "$1/metrics.jsonl" <<'EOF'
import re, sys
for l in open(sys.argv[1]):
    if '"loss"' in l and '"eval_loss"' not in l:
        print(re.search(r'"loss": ?[^,]*', l).group(0), re.search(r'"grad_norm": ?[^,]*', l).group(0))
EOF
}

exactness() { # shape
  local shape=$1 cfg; cfg=$(config "$1")
  [ "$gpus" -ge 2 ] || { say "## exactness: skipped, $gpus GPU"; return; }
  local v; v=$(vocab "$cfg")
  local data; data=$(tokens "$v" $(( (EXACT_STEPS + 1) * EXACT_BATCH * EXACT_SEQ + 1 )))
  local common=(train --init "$cfg" --data "$data" --steps "$EXACT_STEPS" --batch "$EXACT_BATCH" --micro-batch 1
                --seq "$EXACT_SEQ" --device "$device" --warmup 1 --save-every $((EXACT_STEPS / 2)))
  say "## exactness: $shape, global batch $EXACT_BATCH x $EXACT_SEQ, $EXACT_STEPS steps: 1 rank, 2 ranks, 2 ranks resumed"
  launch 1 exact-np1 "${common[@]}" --out /tmp/dp-exact-np1 --overwrite > "$OUT/dp-exact-np1.out" 2>&1 || { say "np1 failed"; tail -5 "$OUT/dp-exact-np1.out" | tee -a "$log"; return; }
  launch 2 exact-np2 "${common[@]}" --out /tmp/dp-exact-np2 --overwrite > "$OUT/dp-exact-np2.out" 2>&1 || { say "np2 failed"; tail -5 "$OUT/dp-exact-np2.out" | tee -a "$log"; return; }
  launch 2 exact-res "${common[@]}" --out /tmp/dp-exact-res --overwrite --stop-at $((EXACT_STEPS / 2)) > "$OUT/dp-exact-res.out" 2>&1 &&
    launch 2 exact-res "${common[@]}" --out /tmp/dp-exact-res --resume >> "$OUT/dp-exact-res.out" 2>&1 ||
    { say "resumed np2 failed"; tail -5 "$OUT/dp-exact-res.out" | tee -a "$log"; return; }
  losses /tmp/dp-exact-np1 > "$OUT/dp-exact-np1.losses"
  losses /tmp/dp-exact-np2 > "$OUT/dp-exact-np2.losses"
  losses /tmp/dp-exact-res > "$OUT/dp-exact-res.losses"
  paste "$OUT/dp-exact-np1.losses" "$OUT/dp-exact-np2.losses" | tee -a "$log"
  python3 - "$OUT/dp-exact-np1.losses" "$OUT/dp-exact-np2.losses" <<'EOF' | tee -a "$log"
import re, sys
num = lambda f: [[float(x) for x in re.findall(r'": ?([-0-9.eE+]+)', l)] for l in open(f)]
a, b = num(sys.argv[1]), num(sys.argv[2])
worst = max(abs(y - x) / abs(x) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
print("RESULT dp exact np1-vs-np2 steps=%d bit_equal=%s max_rel=%.3g (expect not bit-equal, <= 1e-2)" %
      (len(a), "yes" if a == b else "no", worst))
EOF
  local step; step=$(printf "step_%08d" "$EXACT_STEPS") same=yes
  cmp -s "$OUT/dp-exact-np2.losses" "$OUT/dp-exact-res.losses" || same=no
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "/tmp/dp-exact-np2/checkpoints/$step/$f" "/tmp/dp-exact-res/checkpoints/$step/$f" || same=no
  done
  say "RESULT dp exact np2-resumed-vs-uninterrupted bit-identical=$same (expect yes: losses and both checkpoint files)"
}

for shape in $shapes; do scaling "$shape"; done
exactness "${shapes%% *}"
exit 0
