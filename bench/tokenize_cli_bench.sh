#!/usr/bin/env bash
# `megatrain tokenize` as a whole process (start, load tokenizer.json, read JSONL, encode, write the
# token file) against the same job done in Python with Hugging Face `tokenizers` (json per line,
# encode_batch with the post-processor, eos after each document, the uint16/uint32 array written),
# same file, same machine, same cores, in one run. Both outputs must be the same bytes.
#
#   bench/tokenize_cli_bench.sh [TOKENIZER_DIR ...]
#
# Each pair runs pinned (taskset) to each CPU set of CPUSETS (default "0" and every core), with
# that many threads (OMP_NUM_THREADS for megatrain, RAYON_NUM_THREADS for tokenizers); tokens/s per
# core is tokens/s over the set's size. Wall time is the best of REPEAT runs (python
# time.perf_counter around the whole process). Default tokenizers: the fixtures in
# tests/fixtures/tokenizers; pass real model directories (holding tokenizer.json) to measure those.
# The corpus is ~MB MB of JSONL ({"text": ...} a line: Debian fortunes, one fortune a document,
# plus generated multilingual paragraphs), written to $WORK.
# Then chat data: the same documents as conversations (a user turn, an assistant reply), `megatrain
# tokenize --chat --seq 4096 --pack split` (render, encode, loss mask, pack; split so that the rows
# read back as one stream, which is what is compared) against Python rendering the same
# chat template with jinja2 (as transformers does) and encoding with tokenizers (no mask, no
# packing: a lower bound on the Python side's work), for the fixtures that have a chat format.
# Env: PY (default /opt/fixenv/bin/python, needs `tokenizers`, jinja2 and numpy), BUILD (default
# build-bench-cli), MB (default 10), CPUSETS, REPEAT (default 3), WORK.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PY:-/opt/fixenv/bin/python}"
build="${BUILD:-$root/build-bench-cli}"
mb="${MB:-10}"
repeat="${REPEAT:-3}"
ncpu="$(nproc)"
cpusets="${CPUSETS:-0 0-$((ncpu - 1))}"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"

[ $# -eq 0 ] && set -- "$root"/tests/fixtures/tokenizers/{gpt2,llama3,qwen2,llama2}

if [ ! -x "$build/megatrain" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMT_CUDA=OFF >/dev/null
    cmake --build "$build" -j"$ncpu" --target megatrain >/dev/null
fi
mt="$build/megatrain"

corpus="$work/corpus.jsonl"
if [ ! -f "$corpus" ]; then
    "$py" - "$corpus" "$mb" "$root/tests/fixtures/tokenizers" <<'EOF'
import glob, json, os, random, sys
out, mb, fixdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
sys.path.insert(0, fixdir)
from make_tokenizer_fixtures import make_line
fortunes = []
for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if f.endswith((".dat", ".u8")) or os.path.isdir(f):
        continue
    text = open(f, "rb").read().decode("utf-8", errors="replace")
    fortunes += [d.strip("\n") + "\n" for d in text.split("\n%\n") if d.strip()]
rng = random.Random(7)
target, size = int(mb * 1e6), 0
with open(out, "w", encoding="utf-8") as f:
    while size < target:
        if fortunes and rng.random() < 0.7:
            doc = rng.choice(fortunes)
        else:
            doc = "\n".join(make_line(rng) for _ in range(rng.randint(3, 30))) + "\n"
        line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
        f.write(line)
        size += len(line.encode("utf-8"))
EOF
fi
echo "corpus: $corpus ($(stat -c %s "$corpus") bytes, $(wc -l < "$corpus") documents), best of $repeat"

# The Python job: what `megatrain tokenize --tokenizer DIR --out OUT IN.jsonl` does.
py_job="$work/py_tokenize.py"
cat > "$py_job" <<'EOF'
import json, os, sys
import numpy as np
from tokenizers import Tokenizer
d, src, out = sys.argv[1:4]
path = os.path.join(d, "tokenizer.json") if os.path.isdir(d) else d
tok = Tokenizer.from_file(path)
cfg = os.path.join(os.path.dirname(path), "tokenizer_config.json")
eos = None
if os.path.exists(cfg):
    e = json.load(open(cfg)).get("eos_token")
    e = e.get("content") if isinstance(e, dict) else e
    eos = tok.token_to_id(e) if e else None
for name in ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|im_end|>", "<|eot_id|>"):
    if eos is None:
        eos = tok.token_to_id(name)
texts = []
with open(src, encoding="utf-8") as f:
    for line in f:
        if line.strip():
            texts.append(json.loads(line)["text"])
encs = tok.encode_batch(texts, add_special_tokens=True)
dtype = "<u2" if tok.get_vocab_size(with_added_tokens=True) <= 65536 else "<u4"
ids = np.fromiter((i for e in encs for i in (*e.ids, eos)), dtype=np.int64)
ids.astype(dtype).tofile(out)
EOF

# best wall seconds of REPEAT runs of a command (argv), python-timed as a whole process
timer="$work/timer.py"
cat > "$timer" <<'EOF'
import subprocess, sys, time
repeat, cmd = int(sys.argv[1]), sys.argv[2:]
best = 1e30
for _ in range(repeat):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    best = min(best, time.perf_counter() - t0)
print(f"{best:.4f}")
EOF

printf "%-10s %-6s %12s %12s %16s %16s %8s %s\n" tokenizer cpus tokens "megatrain s" "megatrain tok/s/core" \
       "tokenizers tok/s/core" ratio output
for dir in "$@"; do
    name="$(basename "$dir")"
    for set in $cpusets; do
        n=$(taskset -c "$set" nproc)
        c_out="$work/$name.c.bin" p_out="$work/$name.py.bin"
        c_s=$(taskset -c "$set" env OMP_NUM_THREADS="$n" OMP_WAIT_POLICY=passive "$py" "$timer" "$repeat" \
              "$mt" tokenize --tokenizer "$dir" --out "$c_out" "$corpus")
        p_s=$(taskset -c "$set" env RAYON_NUM_THREADS="$n" TOKENIZERS_PARALLELISM=true "$py" "$timer" "$repeat" \
              "$py" "$py_job" "$dir" "$corpus" "$p_out")
        same=IDENTICAL
        cmp -s "$c_out" "$p_out" || same=DIFFER
        elem=2
        "$mt" tokenize --tokenizer "$dir" --out "$c_out" "$corpus" | grep -q "uint32" && elem=4
        tokens=$(( $(stat -c %s "$c_out") / elem ))
        awk -v name="$name" -v n="$n" -v t="$tokens" -v c="$c_s" -v p="$p_s" -v same="$same" 'BEGIN {
            printf "%-10s %-6d %12d %12.3f %16.0f %16.0f %7.2fx %s\n", name, n, t, c, t / c / n, t / p / n, p / c, same }'
    done
done

# ---- chat data ----
chat="$work/chat.jsonl"
if [ ! -f "$chat" ]; then
    "$py" - "$corpus" "$chat" <<'EOF'
import json, sys
with open(sys.argv[1], encoding="utf-8") as f, open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in f:
        lines = json.loads(line)["text"].split("\n")
        k = max(1, len(lines) // 3)
        msgs = [{"role": "user", "content": "\n".join(lines[:k])},
                {"role": "assistant", "content": "\n".join(lines[k:]) or "ok"}]
        out.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
EOF
fi
py_chat="$work/py_chat.py"
cat > "$py_chat" <<'EOF'
import json, os, sys
import numpy as np
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
fixdir, d, fmt, src, out = sys.argv[1:6]
sys.path.insert(0, fixdir)
import make_chat_fixtures as m  # the templates the C formats are tested against
tmpl_src, bos, eos = {"chatml": (m.CHATML, "", ""), "llama3": (m.LLAMA3, "<|begin_of_text|>", "<|end_of_text|>"),
                      "llama2": (m.LLAMA2, "<s>", "</s>")}[fmt]
def raise_exception(msg):
    raise TemplateError(msg)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders
env.globals["raise_exception"] = raise_exception
tmpl = env.from_string(tmpl_src)
tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
texts = []
with open(src, encoding="utf-8") as f:
    for line in f:
        texts.append(tmpl.render(messages=json.loads(line)["messages"], bos_token=bos, eos_token=eos,
                                 add_generation_prompt=False))
encs = tok.encode_batch(texts, add_special_tokens=False)
np.fromiter((i for e in encs for i in e.ids), dtype=np.int64).astype("<u4").tofile(out)
EOF
# The packed stream (rows overlap by one token) against Python's ids, the last row's padding aside.
cmp_chat="$work/cmp_chat.py"
cat > "$cmp_chat" <<'EOF'
import sys
import numpy as np
h = open(sys.argv[1], "rb").read(64)
T, rows, ids_size = (int.from_bytes(h[o:o + n], "little") for o, n in ((12, 4), (16, 8), (28, 4)))
raw = np.fromfile(sys.argv[1], dtype=np.uint8, offset=64).reshape(rows, (T + 1) * ids_size + T)
ids = raw[:, :(T + 1) * ids_size].copy().view("<u2" if ids_size == 2 else "<u4")
stream = np.concatenate([ids[0, :1]] + [r[1:] for r in ids])
ref = np.fromfile(sys.argv[2], dtype="<u4")
print("IDENTICAL" if np.array_equal(stream[:len(ref)], ref) else "DIFFER")
EOF

echo
echo "chat: $chat ($(stat -c %s "$chat") bytes), tokenize --chat --seq 4096 --pack split"
printf "%-10s %-8s %-6s %12s %12s %16s %16s %8s %s\n" tokenizer format cpus tokens "megatrain s" \
       "megatrain tok/s/core" "python tok/s/core" ratio ids
for dir in "$@"; do
    name="$(basename "$dir")"
    case "$name" in qwen2) fmt=chatml ;; llama3) fmt=llama3 ;; llama2) fmt=llama2 ;; *) continue ;; esac
    for set in $cpusets; do
        n=$(taskset -c "$set" nproc)
        c_out="$work/$name.chat.packed" p_out="$work/$name.chat.py.bin"
        c_s=$(taskset -c "$set" env OMP_NUM_THREADS="$n" OMP_WAIT_POLICY=passive "$py" "$timer" "$repeat" \
              "$mt" tokenize --tokenizer "$dir" --chat --chat-format "$fmt" --seq 4096 --long skip \
              --pack split --out "$c_out" "$chat")
        p_s=$(taskset -c "$set" env RAYON_NUM_THREADS="$n" TOKENIZERS_PARALLELISM=true "$py" "$timer" "$repeat" \
              "$py" "$py_chat" "$root/tests/fixtures/chat" "$dir" "$fmt" "$chat" "$p_out")
        same=$("$py" "$cmp_chat" "$c_out" "$p_out")
        tokens=$(( $(stat -c %s "$p_out") / 4 ))
        awk -v name="$name" -v f="$fmt" -v n="$n" -v t="$tokens" -v c="$c_s" -v p="$p_s" -v same="$same" 'BEGIN {
            printf "%-10s %-8s %-6d %12d %12.3f %16.0f %16.0f %7.2fx %s\n", name, f, n, t, c, t / c / n, t / p / n, p / c, same }'
    done
done
