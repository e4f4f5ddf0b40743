#!/usr/bin/env bash
# On the GPU machine, from the repo root, after scripts/gpu-test.sh has built build-gpu/ (issue 11):
# the MegaTrain authors' release (bench/baselines/megatrain_release.py) and megatrain side by side on
# the Qwen2.5-7B shape at long context, random init and tokens.
#   bench/release_longctx.sh 32k 128k
# Phases: 32k = 2 x 32768 (ours: gpu-longctx-check.sh 32kx2), 128k = 1 x 131072 (ours: 128k). With
# no phase it only installs the kit and builds the op (a setup call; later calls on a warm machine
# reuse both). One device command is limited to 10 minutes: one phase a call.
# Needs prebuilt/release/ from scripts/release-deps.sh (run here; carry "prebuilt"). No network:
# the kit's wheels are installed with --no-index into RELPY (default /tmp/relpy), and DeepSpeed's CPU
# Adam op is compiled once up front into TORCH_EXTENSIONS_DIR (default /tmp/dsext) so no release
# step pays for it.
# Env: STEPS (default 3), RELEASE_TIMEOUT (seconds for each release run, default 300), CONFIG
# (default bench/configs/qwen2.5-7b-512k.json, both sides), RELEASE_SDPA (the probe's SDPA backend),
# OUT, MT_BIN, MT_DEPS, STATE, ATTN, FLAGS (passed on to scripts/gpu-longctx-check.sh for ours).
# Writes $OUT/release.log (every result line, the op build, both sides' summaries) and one file per
# release run, $OUT/release-<phase>.out; ours add $OUT/longctx.log and $OUT/longctx-<name>.out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt-out}
mkdir -p "$OUT"
log=$OUT/release.log
kit=prebuilt/release
py=${RELPY:-/tmp/relpy}
STEPS=${STEPS:-3}
RELEASE_TIMEOUT=${RELEASE_TIMEOUT:-300}
export CONFIG=${CONFIG:-bench/configs/qwen2.5-7b-512k.json}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/dsext}
export DS_ACCELERATOR=cuda
say() { echo "$@" | tee -a "$log"; }
say "# release_longctx $* STEPS=$STEPS RELEASE_TIMEOUT=$RELEASE_TIMEOUT CONFIG=$CONFIG RELEASE_SDPA=${RELEASE_SDPA:-} $(date -u +%FT%TZ)"
[ -f "$kit/mtref/infinity/model/cpu_master.py" ] && compgen -G "$kit/wheels/deepspeed-*.whl" >/dev/null || {
  say "release_longctx: $kit/ is missing or incomplete: run scripts/release-deps.sh GIT_DIR on the dev machine and carry prebuilt"
  exit 1
}
say "release commit $(cat "$kit/COMMIT" 2>/dev/null || echo unknown), $(ls "$kit"/wheels/*.whl | wc -l) wheels"

# the kit's wheels into $py, once; pip without an index, or plain unzip where the image has no pip
if [ ! -f "$py/.installed" ]; then
  rm -rf "$py"
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$py" "$kit"/wheels/*.whl 2>&1 | tail -5 | tee -a "$log"
  else
    python3 - "$py" "$kit"/wheels/*.whl <<'EOF'
import os, sys, zipfile
target = sys.argv[1]
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            parts = n.split("/")
            if parts[0].endswith(".data"):  # NAME.data/{purelib,platlib,scripts}/...
                if parts[1] == "scripts": dest = os.path.join(target, "bin", *parts[2:])
                else: dest = os.path.join(target, *parts[2:])
            else: dest = os.path.join(target, n)
            if n.endswith("/"): continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f: f.write(z.read(n))
            if parts[0].endswith(".data") and parts[1] == "scripts": os.chmod(dest, 0o755)
EOF
  fi
  [ -x "$py/bin/ninja" ] && [ -f "$py/deepspeed/__init__.py" ] && [ -d "$py/pydantic_core" ] ||
    { say "release_longctx: installing $kit/wheels into $py failed (see above)"; exit 1; }
  touch "$py/.installed"
fi
orig_pythonpath=${PYTHONPATH:-}
export PATH="$py/bin:$PATH"
export PYTHONPATH="$py:$PWD/$kit/mtref${PYTHONPATH:+:$PYTHONPATH}"
export MTREF=$PWD/$kit/mtref
python3 -c "import torch, transformers, deepspeed, infinity, sys
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | grep -v Warning | tail -3 | tee -a "$log"

# DeepSpeed's CPU Adam op: a JIT torch extension (gcc, -march=native); built once, the time kept
t0=$(date +%s)
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > /tmp/dsbuild.log 2>&1
rc=$?
say "deepspeed cpu_adam build: rc $rc, $(( $(date +%s) - t0 )) s (TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR, log /tmp/dsbuild.log)"
if [ $rc -eq 0 ]; then tail -4 /tmp/dsbuild.log >> "$log"; else tail -40 /tmp/dsbuild.log | tee -a "$log"; fi
free -g | head -2 | tee -a "$log"

release() { # phase batch seq
  local phase=$1 batch=$2 seq=$3 out=$OUT/release-$1.out
  say "## release $phase: $batch x $seq, STEPS=$STEPS, timeout ${RELEASE_TIMEOUT}s"
  # time outside timeout, so a run stopped by it still reports its peak RSS
  /usr/bin/time -v timeout -k 30 "$RELEASE_TIMEOUT" \
    python3 bench/baselines/megatrain_release.py "$CONFIG" "$batch" "$seq" "$STEPS" > "$out" 2>&1
  local rc=$?
  grep -E "params \(|^optimizer|^!!|^step |^RESULT|Maximum resident set size|Elapsed" "$out" | tee -a "$log"
  case $rc in
  0) ;;
  124|137) say "release $phase: stopped by the ${RELEASE_TIMEOUT}s timeout (RELEASE_TIMEOUT)" ;;
  *) say "release $phase failed (rc $rc):"; grep -vE "^(step |$(printf '\t')|Command (exited|being timed))" "$out" | tail -8 | tee -a "$log" ;;
  esac
}
ours() { # name (a phase of scripts/gpu-longctx-check.sh)
  [ -x "${MT_BIN:-build-gpu/megatrain}" ] || { say "ours $1: no ${MT_BIN:-build-gpu/megatrain} (run scripts/gpu-test.sh first)"; return; }
  say "## megatrain $1 (scripts/gpu-longctx-check.sh, CONFIG=$CONFIG)"
  # its python (make_tokens.py, summarize.py) needs nothing from the kit
  PYTHONPATH=$orig_pythonpath STEPS=$STEPS bash scripts/gpu-longctx-check.sh "$1" | grep -E "^(RESULT|failed|## |step |megatrain: )|Maximum resident|Elapsed" | tee -a "$log"
}

for phase in "$@"; do
  case $phase in
  32k) release 32k 2 32768; ours 32kx2 ;;
  128k) release 128k 1 131072; ours 128k ;;
  *) say "unknown phase $phase (use 32k, 128k)" ;;
  esac
done
exit 0
