#!/usr/bin/env bash
# Tokenizer speed: megatrain's C tokenizer against Hugging Face `tokenizers` (Python), same file,
# same machine, one core each (taskset), in one run. Also checks both give the same ids.
# Two modes: "lines" encodes each line as its own document (tokenizers' encode_batch on one thread;
# megatrain one call per line), which is how a data pipeline calls a tokenizer; "whole" encodes the
# file as one string (tokenizers' encode), where tokenizers' offset bookkeeping is slow.
#
#   bench/tokenizer_bench.sh [TOKENIZER_DIR ...]
#
# Default tokenizers: the fixtures in tests/fixtures/tokenizers (gpt2, llama3, qwen2, llama2); pass
# real model directories (holding tokenizer.json) to measure those. The text is ~10 MB: the Debian
# fortunes corpus (English) plus generated multilingual lines, written as UTF-8 to $WORK.
# Env: PY (default /opt/fixenv/bin/python, needs `tokenizers`), BUILD (default build-bench),
# MB (default 10), CORE (default 0), REPEAT (default 3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PY:-/opt/fixenv/bin/python}"
build="${BUILD:-$root/build-bench}"
mb="${MB:-10}"
core="${CORE:-0}"
repeat="${REPEAT:-3}"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"

if [ $# -eq 0 ]; then
    set -- "$root"/tests/fixtures/tokenizers/{gpt2,llama3,qwen2,llama2}
fi

if [ ! -x "$build/test_tokenizer_speed" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j"$(nproc)" --target test_tokenizer_speed >/dev/null
fi

text="$work/bench_text.txt"
if [ ! -f "$text" ]; then
    "$py" - "$text" "$mb" "$root/tests/fixtures/tokenizers" <<'EOF'
import glob, os, random, sys
out, mb, fixdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
sys.path.insert(0, fixdir)
from make_tokenizer_fixtures import make_line
parts = []
for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if f.endswith((".dat", ".u8")) or os.path.isdir(f):
        continue
    parts.append(open(f, "rb").read().decode("utf-8", errors="replace"))
english = "\n".join(parts)
rng = random.Random(7)
target = int(mb * 1e6)
chunks, size = [], 0
while size < target:
    if english and rng.random() < 0.7:
        start = rng.randrange(max(1, len(english) - 20000))
        c = english[start:start + 20000]
    else:
        c = "\n".join(make_line(rng) for _ in range(200)) + "\n"
    chunks.append(c)
    size += len(c.encode("utf-8"))
open(out, "w", encoding="utf-8").write("".join(chunks))
EOF
fi
bytes=$(stat -c %s "$text")
echo "text: $text ($bytes bytes), core $core, best of $repeat"

py_bench="$work/py_bench.py"
cat > "$py_bench" <<'EOF'
import os, sys, time
import numpy as np
from tokenizers import Tokenizer
d, path, repeat, ids_out, lines = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json") if os.path.isdir(d) else d)
text = open(path, encoding="utf-8", newline="").read()  # newline="": bytes as the C side reads them
docs = text.split("\n")
docs = [x + "\n" for x in docs[:-1]] + ([docs[-1]] if docs[-1] else [])
best, first = 1e30, None
for r in range(repeat):
    t0 = time.perf_counter()
    if lines:
        encs = tok.encode_batch(docs, add_special_tokens=False)
    else:
        ids = tok.encode(text, add_special_tokens=False).ids
    dt = time.perf_counter() - t0
    first = dt if first is None else first
    best = min(best, dt)
if lines:
    ids = [i for e in encs for i in e.ids]
np.array(ids, dtype="<u4").tofile(ids_out)
print(f"tokenizers: {len(ids)} tokens, first {first:.3f} s, best {best:.3f} s, {len(ids)/best:.0f} tokens/s")
EOF

for dir in "$@"; do
  name="$(basename "$dir")"
  for mode in lines whole; do
    lines=0
    [ "$mode" = lines ] && lines=1
    c_line=$(taskset -c "$core" "$build/test_tokenizer_speed" --bench "$dir" "$text" \
             --repeat "$repeat" --ids-out "$work/$name.c.ids" --lines "$lines")
    py_line=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false taskset -c "$core" \
              "$py" "$py_bench" "$dir" "$text" "$repeat" "$work/$name.py.ids" "$lines")
    same="ids IDENTICAL"
    cmp -s "$work/$name.c.ids" "$work/$name.py.ids" || same="ids DIFFER"
    c_rate=$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' <<<"$c_line")
    py_rate=$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' <<<"$py_line")
    echo "== $name ($mode): $same"
    echo "   $c_line"
    echo "   $py_line"
    awk -v c="$c_rate" -v p="$py_rate" 'BEGIN { printf "   ratio megatrain/tokenizers: %.2fx\n", c / p }'
  done
done
