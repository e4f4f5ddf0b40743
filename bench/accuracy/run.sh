#!/usr/bin/env bash
# The accuracy cost of the optimizer state formats: the same model, data, seed and schedule trained
# once per format (`megatrain train --state FORMAT`), evaluated on the held-out set during and after
# training; the final eval losses compared with full's (goal: compact within 0.5%, tight within 1.5%).
#
#   bench/accuracy/run.sh [options] FORMAT... [-- TRAIN_FLAGS...]
#     --profile small|big  small (default): configs/small.json (5.2M params) on this CPU box;
#                          big: configs/big.json (120M params) with --device cuda
#     --root DIR           run directories ROOT/FORMAT/, summary.md and curves (default
#                          bench/accuracy/runs/PROFILE, whose summary and curves are also copied
#                          to bench/accuracy/results-PROFILE.md and PROFILE-*.svg)
#     --parallel           train the formats at once (GPUs: format i on GPU i mod count; one GPU is
#                          shared, each run capped at --gpu-mem $PAR_GPU_MEM, default 40G)
#     --steps N            override the profile's steps (the schedule follows)
#     --max-time S         each train stops and saves after S seconds; running run.sh again with
#                          the same arguments resumes the unfinished ones
#     --fresh              discard earlier runs in ROOT instead of resuming/keeping them
#     --seed N             init and data order (default 1337); full with another seed into another
#                          --root gives the seed-to-seed spread that the gaps are read against
#   TRAIN_FLAGS go to every `megatrain train` (e.g. --gpu-mem 24G).
# Needs prepare.sh's token files in $DATA (default bench/accuracy/data). Env: MT (megatrain
# binary), DATA. A finished format (ROOT/FORMAT/done) is not trained again; its eval is reused.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DATA=${DATA:-$HERE/data}
PROFILE=small ROOT= PARALLEL=0 STEPS= MAX_TIME= FRESH=0 SEED=1337 FORMATS=() EXTRA=()
die() { echo "run.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) PROFILE=${2:?--profile needs small or big}; shift 2 ;;
        --root) ROOT=${2:?--root needs a directory}; shift 2 ;;
        --parallel) PARALLEL=1; shift ;;
        --steps) STEPS=${2:?--steps needs N}; shift 2 ;;
        --max-time) MAX_TIME=${2:?--max-time needs seconds}; shift 2 ;;
        --seed) SEED=${2:?--seed needs N}; shift 2 ;;
        --fresh) FRESH=1; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -*) die "unknown option $1 (see the comment at the top of run.sh)" ;;
        *) FORMATS+=("$1"); shift ;;
    esac
done
[ ${#FORMATS[@]} -gt 0 ] || die "usage: run.sh [--profile small|big] [--root DIR] [--parallel] FORMAT... (full, compact, tight)"
for f in "${FORMATS[@]}"; do
    case "$f" in full|compact|tight) ;; *) die "format '$f': expected full, compact or tight" ;; esac
done

# Both profiles: warmup + cosine to lr/10, AdamW defaults (betas 0.9/0.95, wd 0.1, clip 1).
case "$PROFILE" in
    small)  # measured on the 2-core dev box: ~0.45 s a step at 2 threads when it is not shared
        CONFIG=$HERE/configs/small.json DEVICE=cpu SEQ=256 BATCH=2 STEPS=${STEPS:-2000} LR=1e-3
        EVAL_EVERY=200 EVAL_BATCHES=32 FINAL_BATCHES=32 SAVE_EVERY=500 THREADS=${THREADS:-2} ;;
    big)    # 16k tokens a step: 2000 steps are 33M tokens, 0.6 epoch of train.bin
        # eval: 54 x 16 rows of 1025 tokens = 864 of eval.bin's 867 rows, each time; the final
        # value is train's eval at the last step
        CONFIG=$HERE/configs/big.json DEVICE=cuda SEQ=1024 BATCH=16 STEPS=${STEPS:-2000} LR=6e-4
        EVAL_EVERY=200 EVAL_BATCHES=54 FINAL_BATCHES=0 SAVE_EVERY=500 THREADS=${THREADS:-} ;;
    *) die "--profile $PROFILE: expected small or big" ;;
esac
WARMUP=$((STEPS / 20))
ROOT=${ROOT:-$HERE/runs/$PROFILE}
if [ -z "${MT:-}" ]; then
    for m in "$REPO/build/megatrain" "$REPO/build-cpu/megatrain"; do [ -x "$m" ] && MT=$m && break; done
fi
[ -x "${MT:-}" ] || die "no megatrain binary (build it, or set MT=path)"
for f in train.bin eval.bin; do [ -f "$DATA/$f" ] || die "$DATA/$f missing: run bench/accuracy/prepare.sh first"; done
HAS_STATE=0
help=$("$MT" train --help 2>&1) # not piped into grep -q: an early exit would fail the pipeline
case $help in *--state*) HAS_STATE=1 ;; esac
for f in "${FORMATS[@]}"; do
    [ "$HAS_STATE" = 1 ] || [ "$f" = full ] || die "$MT train has no --state flag yet: only 'full' can run"
done
mkdir -p "$ROOT"

NGPU=0
if [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null; then NGPU=$(nvidia-smi -L | grep -c '^GPU' || true); fi
if [ "$PARALLEL" = 1 ] && [ -z "$THREADS" ]; then THREADS=$(( $(nproc) / ${#FORMATS[@]} )); [ "$THREADS" -ge 1 ] || THREADS=1; fi

train_one() {  # $1 format, $2 index
    local fmt=$1 i=$2 out=$ROOT/$1 args=()
    [ "$FRESH" = 1 ] && rm -rf "$out"
    # what shapes the result; a finished or resumed run made with other settings is not reused
    local settings="profile $PROFILE seed $SEED steps $STEPS batch $BATCH seq $SEQ lr $LR warmup $WARMUP config $(cksum <"$CONFIG" | cut -d' ' -f1) data $(stat -c %s "$DATA/train.bin")"
    if [ -f "$out/settings" ] && [ "$(cat "$out/settings")" != "$settings" ]; then
        echo "run.sh: $out was trained with other settings ($(cat "$out/settings")); use --fresh or another --root" >&2
        return 1
    fi
    if [ -f "$out/done" ]; then echo "run.sh: $fmt already trained ($out/done)"; return 0; fi
    if compgen -G "$out/checkpoints/step_*" >/dev/null; then args+=(--resume); else args+=(--overwrite); fi
    [ "$HAS_STATE" = 1 ] && args+=(--state "$fmt")
    [ -n "$THREADS" ] && args+=(--threads "$THREADS")
    [ -n "$MAX_TIME" ] && args+=(--max-time "$MAX_TIME")
    local env=()
    [ "$DEVICE" = cpu ] && [ -n "$THREADS" ] && env+=(OMP_NUM_THREADS="$THREADS")
    if [ "$PARALLEL" = 1 ] && [ "$NGPU" -gt 0 ]; then
        env+=(CUDA_VISIBLE_DEVICES=$((i % NGPU)))
        if [ "$NGPU" -lt ${#FORMATS[@]} ]; then args+=(--gpu-mem "${PAR_GPU_MEM:-40G}"); fi
    fi
    mkdir -p "$out"
    echo "$settings" >"$out/settings"
    echo "run.sh: training $fmt into $out"
    local t0=$SECONDS rc=0
    env "${env[@]}" "$MT" train --init "$CONFIG" --data "$DATA/train.bin" --eval-data "$DATA/eval.bin" \
        --eval-every "$EVAL_EVERY" --eval-batches "$EVAL_BATCHES" --out "$out" \
        --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --lr "$LR" --min-lr "$(awk -v l="$LR" 'BEGIN{print l/10}')" \
        --warmup "$WARMUP" --schedule cosine --seed "$SEED" --device "$DEVICE" --save-every "$SAVE_EVERY" --keep 1 \
        "${args[@]}" "${EXTRA[@]}" >>"$out/train.log" 2>&1 || rc=$?
    echo $((SECONDS - t0)) >>"$out/wall_s"
    [ "$rc" = 0 ] || { echo "run.sh: $fmt: train failed (exit $rc), see $out/train.log" >&2; tail -3 "$out/train.log" >&2; return 1; }
    local last
    last=$(grep -o '^{"step": [0-9]*, "loss"' "$out/metrics.jsonl" | tail -1 | grep -o '[0-9][0-9]*')
    if [ "${last:-0}" -ge "$STEPS" ]; then
        if [ "$FINAL_BATCHES" -gt 0 ]; then  # the saved model, read back by `megatrain eval` (CPU)
            local ck
            ck=$(ls -d "$out"/checkpoints/step_* | sort | tail -1)
            env "${env[@]}" "$MT" eval --model "$ck" --data "$DATA/eval.bin" --batch 8 --seq "$SEQ" \
                --batches "$FINAL_BATCHES" >"$out/final_eval.txt" 2>&1 \
                || { echo "run.sh: $fmt: eval failed, see $out/final_eval.txt" >&2; return 1; }
        else  # train's own eval at the last step (on the GPU; `megatrain eval` runs on the CPU only)
            grep "^{\"step\": $STEPS, \"eval_loss\"" "$out/metrics.jsonl" | tail -1 | awk '{
                e = $0; sub(/.*"eval_loss": /, "", e); sub(/[^-0-9.e+].*/, "", e)
                n = $0; sub(/.*"eval_tokens": /, "", n); sub(/[^0-9].*/, "", n)
                printf "eval (train, last step): loss %s, perplexity %.2f, %s tokens\n", e, exp(e), n }' >"$out/final_eval.txt"
            [ -s "$out/final_eval.txt" ] || { echo "run.sh: $fmt: no eval at step $STEPS in $out/metrics.jsonl" >&2; return 1; }
        fi
        touch "$out/done"
        echo "run.sh: $fmt done: $(cat "$out/final_eval.txt" | tail -1)"
    else
        echo "run.sh: $fmt stopped at step ${last:-0} of $STEPS: run the same command again to resume"
    fi
}

status=0
if [ "$PARALLEL" = 1 ]; then
    pids=()
    for i in "${!FORMATS[@]}"; do train_one "${FORMATS[$i]}" "$i" & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
else
    for i in "${!FORMATS[@]}"; do train_one "${FORMATS[$i]}" "$i" || status=1; done
fi

# ---- the summary: final eval per format, the gap to full, the eval curve, SVGs ----
num() { sed -n "s/.*\"$1\": \\([-0-9.e+]*\\).*/\\1/p"; }
final_loss() { sed -n 's/.* loss \([0-9.]*\), perplexity.*/\1/p' "$ROOT/$1/final_eval.txt" 2>/dev/null | tail -1; }
FULL=$(final_loss full || true)
S=$ROOT/summary.md
{
    echo "# Optimizer state formats: accuracy ($PROFILE profile)"
    echo
    echo "$("$MT" --version | head -1); $(date -u +%Y-%m-%dT%H:%MZ); $(basename "$CONFIG") ($("$MT" info --init "$CONFIG" | sed -n 's/^parameters: \([0-9]*\).*/\1/p') params),"
    echo "--device $DEVICE, --batch $BATCH --seq $SEQ --steps $STEPS, --lr $LR cosine to lr/10, --warmup $WARMUP, --seed $SEED;"
    echo "data: ${DATA#"$REPO"/}/train.bin ($(( $(stat -c %s "$DATA/train.bin") / 2 )) tokens), eval ${DATA#"$REPO"/}/eval.bin ($(( $(stat -c %s "$DATA/eval.bin") / 2 )) tokens)."
    if [ "$FINAL_BATCHES" -gt 0 ]; then echo "Final eval: \`megatrain eval\` of the last checkpoint, $FINAL_BATCHES batches of 8 x $SEQ."
    else echo "Final eval: train's eval at step $STEPS, $EVAL_BATCHES batches of $BATCH x $SEQ."; fi
    echo
    echo "| format | final eval loss | vs full | goal | last train loss (mean of last 50) | mean ms/step | train wall s |"
    echo "|---|---|---|---|---|---|---|"
    for f in "${FORMATS[@]}"; do
        d=$ROOT/$f; L=$(final_loss "$f" || true)
        gap=-; goal=-
        if [ -n "$L" ] && [ -n "$FULL" ]; then
            gap=$(awk -v a="$L" -v b="$FULL" 'BEGIN{printf "%+.3f%%", (a/b-1)*100}')
            lim=; [ "$f" = compact ] && lim=0.5; [ "$f" = tight ] && lim=1.5
            [ -n "$lim" ] && goal=$(awk -v a="$L" -v b="$FULL" -v l="$lim" 'BEGIN{print ((a/b-1)*100 <= l) ? "within " l "%: yes" : "within " l "%: NO"}')
        fi
        tl=$(grep '"loss"' "$d/metrics.jsonl" 2>/dev/null | tail -50 | num loss | awk '{s+=$1;n++} END{if(n) printf "%.4f", s/n}')
        ms=$(grep '"loss"' "$d/metrics.jsonl" 2>/dev/null | num ms | awk '{s+=$1;n++} END{if(n) printf "%.0f", s/n}')
        wall=$(awk '{s+=$1} END{print s+0}' "$d/wall_s" 2>/dev/null || echo -)
        echo "| $f | ${L:-(not finished)} | $gap | $goal | ${tl:--} | ${ms:--} | $wall |"
    done
    echo
    echo "Eval loss during training (\`--eval-batches $EVAL_BATCHES\` of $BATCH x $SEQ, the same rows each time):"
    echo
    printf '| step |'; for f in "${FORMATS[@]}"; do printf ' %s |' "$f"; done; echo
    printf '|---|'; for f in "${FORMATS[@]}"; do printf -- '---|'; done; echo
    for f in "${FORMATS[@]}"; do
        grep '"eval_loss"' "$ROOT/$f/metrics.jsonl" 2>/dev/null | awk -v f="$f" '{
            s = $0; sub(/.*"step": /, "", s); sub(/[^0-9].*/, "", s)
            e = $0; sub(/.*"eval_loss": /, "", e); sub(/[^-0-9.e+].*/, "", e); print s, f, e }'
    done | awk -v fl="${FORMATS[*]}" '{ v[$1 " " $2] = $3; if (!($1 in seen)) { seen[$1] = 1; st[n++] = $1 } }
        END { nf = split(fl, F, " "); for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (st[j] + 0 < st[i] + 0) { t = st[i]; st[i] = st[j]; st[j] = t }
              for (i = 0; i < n; i++) { line = "| " st[i] " |"; for (k = 1; k <= nf; k++) line = line " " ((st[i] " " F[k]) in v ? v[st[i] " " F[k]] : "-") " |"; print line } }'
    echo
    echo "Curves: $(for f in "${FORMATS[@]}"; do printf '%s-%s.svg ' "$PROFILE" "$f"; done)(\`megatrain plot\`), $PROFILE-eval.svg (eval loss of all formats)."
} >"$S"
for f in "${FORMATS[@]}"; do
    [ -f "$ROOT/$f/metrics.jsonl" ] && "$MT" plot --out "$ROOT/$PROFILE-$f.svg" "$ROOT/$f" >/dev/null
done
"$HERE/eval_svg.sh" "$ROOT" "${FORMATS[@]}" >"$ROOT/$PROFILE-eval.svg"
# a run in the default root is published beside the scripts (on the GPU box: copy ROOT to $OUT
# to bring it back)
if [ "$ROOT" = "$HERE/runs/$PROFILE" ]; then
    cp "$S" "$HERE/results-$PROFILE.md"
    cp "$ROOT"/"$PROFILE"-*.svg "$HERE/" 2>/dev/null || true
fi
cat "$S"
exit $status
