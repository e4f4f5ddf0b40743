#!/usr/bin/env bash
# The accuracy benchmark's data: a real C corpus (Linux .c/.h files), its byte-level BPE tokenizer
# and the token files `megatrain train --data/--eval-data` read. Everything goes to $DATA
# (default bench/accuracy/data, ignored by git); the tokenizer is committed in tokenizer/.
#
#   bench/accuracy/prepare.sh                  this box: corpus from Debian's linux-source, the
#                                              tokenizer (trained once, Python `tokenizers` in a
#                                              venv), token files, the check that megatrain and
#                                              Hugging Face encode alike, corpus.tar.xz to carry
#   bench/accuracy/prepare.sh --from-archive F a box without Python or network (the GPU one): the
#                                              text from F (corpus.tar.xz or .tar.gz), tokenized
#                                              with the committed tokenizer; checked against
#                                              tokens.sha256
# Env: MT (megatrain binary, default build-cpu/megatrain, else build/megatrain), DATA, VENV
# (default bench/accuracy/.venv), RETRAIN_TOKENIZER=1 to train the tokenizer again.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DATA=${DATA:-$HERE/data}
VENV=${VENV:-$HERE/.venv}
SEP='%%MT-ACCURACY-FILE%%'   # the --doc-sep line between files; no source line equals it
TOK=$HERE/tokenizer
if [ -z "${MT:-}" ]; then
    for m in "$ROOT/build-cpu/megatrain" "$ROOT/build/megatrain"; do [ -x "$m" ] && MT=$m && break; done
fi
[ -x "${MT:-}" ] || { echo "prepare.sh: no megatrain binary (build it, or set MT=path)" >&2; exit 1; }
mkdir -p "$DATA"
say() { echo "prepare.sh: $*"; }

tokenize() {  # the two token files, from $DATA/train.txt and $DATA/eval.txt
    for part in train eval; do
        "$MT" tokenize --tokenizer "$TOK" --doc-sep "$SEP" --out "$DATA/$part.bin" "$DATA/$part.txt"
    done
}

if [ "${1:-}" = "--from-archive" ]; then
    ARCH=${2:?prepare.sh: --from-archive needs the archive path}
    case "$ARCH" in
        *.xz) xz -dc "$ARCH" | tar -xf - -C "$DATA" ;;
        *.gz) gzip -dc "$ARCH" | tar -xf - -C "$DATA" ;;
        *) echo "prepare.sh: $ARCH: expected corpus.tar.xz or corpus.tar.gz" >&2; exit 1 ;;
    esac
    tokenize
    (cd "$DATA" && sha256sum -c "$HERE/tokens.sha256")
    say "token files in $DATA match tokens.sha256"
    exit 0
fi
[ $# -eq 0 ] || { echo "usage: prepare.sh [--from-archive corpus.tar.xz]" >&2; exit 1; }

# 1. the Linux source tarball (Debian's linux-source package)
SRC_TAR=$(ls /usr/src/linux-source-*.tar.xz 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$SRC_TAR" ]; then
    say "installing linux-source"
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y linux-source >/dev/null
    SRC_TAR=$(ls /usr/src/linux-source-*.tar.xz | sort -V | tail -1)
fi
say "source: $SRC_TAR"

# 2. Python with tokenizers (only here, never at train time)
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/python" -c 'import tokenizers' 2>/dev/null || "$VENV/bin/pip" install -q 'tokenizers==0.23.3'
PY=$VENV/bin/python

# 3. the corpus: train.txt, eval.txt (1% of the files by path hash), files.txt (which is which)
"$PY" "$HERE/corpus.py" "$SRC_TAR" "$SEP" "$DATA/train.txt" "$DATA/eval.txt" "$DATA/files.txt" \
    | tee "$DATA/corpus.json"

# 4. the tokenizer (committed; trained on train.txt only)
if [ ! -f "$TOK/tokenizer.json" ] || [ "${RETRAIN_TOKENIZER:-0}" = 1 ]; then
    say "training the tokenizer (vocab 8192)"
    "$PY" "$HERE/tokenizer.py" train "$DATA/train.txt" "$SEP" 8192 "$TOK"
fi

# 5. token files, and the check that megatrain's tokenizer is Hugging Face's: all of eval and the
#    first 300 train files, byte for byte
tokenize
"$PY" "$HERE/tokenizer.py" encode "$TOK/tokenizer.json" "$DATA/eval.txt" "$SEP" "$DATA/eval.hf.bin"
cmp "$DATA/eval.bin" "$DATA/eval.hf.bin"
awk -v sep="$SEP" '{ print } $0 == sep && ++n == 300 { exit }' "$DATA/train.txt" > "$DATA/sample.txt"
"$MT" tokenize --tokenizer "$TOK" --doc-sep "$SEP" --out "$DATA/sample.bin" "$DATA/sample.txt"
"$PY" "$HERE/tokenizer.py" encode "$TOK/tokenizer.json" "$DATA/sample.txt" "$SEP" "$DATA/sample.hf.bin"
cmp "$DATA/sample.bin" "$DATA/sample.hf.bin"
say "megatrain and Hugging Face tokenizers agree on eval.txt and the first 300 train files"
(cd "$DATA" && sha256sum train.bin eval.bin) > "$HERE/tokens.sha256.new"
if [ -f "$HERE/tokens.sha256" ] && ! cmp -s "$HERE/tokens.sha256" "$HERE/tokens.sha256.new"; then
    say "warning: token files differ from tokens.sha256 (new checksums in tokens.sha256.new)"
else
    mv "$HERE/tokens.sha256.new" "$HERE/tokens.sha256"
fi

# 6. the text archive for a box without Python (deterministic tar; xz -9, else gzip -9)
TAR_OPTS=(--sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$DATA")
if command -v xz >/dev/null; then
    tar "${TAR_OPTS[@]}" -cf - train.txt eval.txt | xz -9 -T1 > "$DATA/corpus.tar.xz.tmp"
    mv "$DATA/corpus.tar.xz.tmp" "$DATA/corpus.tar.xz"; ARCH=$DATA/corpus.tar.xz
else
    tar "${TAR_OPTS[@]}" -cf - train.txt eval.txt | gzip -9n > "$DATA/corpus.tar.gz.tmp"
    mv "$DATA/corpus.tar.gz.tmp" "$DATA/corpus.tar.gz"; ARCH=$DATA/corpus.tar.gz
fi
ls -l "$DATA"/train.txt "$DATA"/eval.txt "$DATA"/train.bin "$DATA"/eval.bin "$ARCH"
say "done: $ARCH carries the text; tokenizer in $TOK"
