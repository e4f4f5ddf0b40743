#!/usr/bin/env bash
# Runs tests/tensorboard_roundtrip.py with a Python that has the tensorboard package: python3 when
# it has it, else the fixture venv ($MEGATRAIN_FIXENV, default ~/.cache/megatrain/fixenv), else a
# venv made once in the build directory with `pip install tensorboard`. Skips (exit 77) when none
# can be had, e.g. offline.  Usage: tensorboard_roundtrip.sh MEGATRAIN CONFIG.json BUILD_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 config=$2 build=$3
has_tb() { [ -x "$1" ] && "$1" -c 'import tensorboard' >/dev/null 2>&1; }
py=
for cand in "$(command -v python3 || true)" "${MEGATRAIN_FIXENV:-$HOME/.cache/megatrain/fixenv}/bin/python" \
            "$build/tb-venv/bin/python"; do
  if has_tb "$cand"; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  venv=$build/tb-venv
  echo "tensorboard_roundtrip: no Python with tensorboard; making $venv (pip install tensorboard)"
  rm -rf "$venv"
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet tensorboard; } >"$build/tb-venv.log" 2>&1 ||
     ! has_tb "$venv/bin/python"; then
    echo "SKIP: the tensorboard package cannot be installed here (python3 -m venv and pip install" \
         "tensorboard failed: $build/tb-venv.log); the TensorBoard round trip is not checked"
    tail -n 3 "$build/tb-venv.log" 2>/dev/null || true
    exit 77
  fi
  py=$venv/bin/python
fi
echo "tensorboard_roundtrip: $py (tensorboard $("$py" -c 'import tensorboard; print(tensorboard.__version__)'))"
exec "$py" "$here/tensorboard_roundtrip.py" "$bin" "$config"
