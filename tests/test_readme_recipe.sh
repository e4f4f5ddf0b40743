#!/usr/bin/env bash
# The README's fine-tuning recipe runs as written, on a tiny model on the CPU:
#  - README.md's first screen (its first 60 lines) has ./run.sh, ./test.sh and the recipe's train
#    command;
#  - the shell blocks marked `<!-- recipe -->` (a fenced ```sh block right after the comment) run,
#    in order and verbatim, with `bash -e` in an empty directory that holds what they name: the
#    "Hugging Face model" directories (a tiny qwen2 model with the qwen2 fixture tokenizer under the
#    recipe's model name; the Qwen2.5-7B config for the plan) and a chat.jsonl of generated
#    conversations; the built megatrain first on PATH;
#  - what the recipe says it writes is there (the checkpoint directory with its tokenizer), and the
#    resume command resumed;
#  - the ```python block marked `<!-- recipe-python -->` (loading the checkpoint in transformers)
#    runs when python3 can import transformers and torch; otherwise it is skipped, saying so;
#  - every relative link and every backticked repository path in README.md and docs/*.md exists.
# Environment: MT_BIN (the megatrain binary), MT_SOURCE_DIR (the repository).
set -euo pipefail
bin=${MT_BIN:?MT_BIN: the megatrain binary}
src=${MT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
readme=$src/README.md
fail() { echo "test_readme_recipe: FAIL: $*" >&2; exit 1; }

# ---- the first screen ----
head -n 60 "$readme" > /dev/null
for want in './run.sh' './test.sh' 'megatrain train --model'; do
  head -n 60 "$readme" | grep -qF -- "$want" || fail "README.md's first 60 lines lack '$want'"
done

# ---- the marked blocks ----
# blocks MARK LANG: the fenced ```LANG blocks that follow a line `<!-- MARK -->`, concatenated
blocks() {
  awk -v mark="<!-- $1 -->" -v open="\`\`\`$2" '
    $0 == mark { armed = 1; next }
    armed && $0 == open { inblock = 1; armed = 0; next }
    inblock && $0 == "```" { inblock = 0; n++; next }
    inblock { print; next }
    armed && $0 != "" { armed = 0 }
    END { if (inblock) exit 2; if (!n) exit 3 }' "$readme"
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mt_readme.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
blocks recipe sh > "$tmp/recipe.sh" || fail "no complete \`\`\`sh block after <!-- recipe --> in README.md"
head -n 60 "$readme" | grep -qF -- "$(grep -m1 'megatrain train --model' "$tmp/recipe.sh")" ||
  fail "the recipe's train command is not on README.md's first screen"
echo "--- the recipe (README.md):"
cat "$tmp/recipe.sh"

# ---- what the recipe names: model directories and chat data ----
work=$tmp/work
mkdir -p "$work"
cd "$work"
model=$(grep -m1 -o -- '--model [^ ]*' "$tmp/recipe.sh" | cut -d' ' -f2)
[ -n "$model" ] || fail "the recipe names no --model"
# a tiny qwen2 model (random weights, written by megatrain itself) with the qwen2 fixture tokenizer
cat > "$tmp/tiny.json" <<'EOF'
{
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "hidden_size": 32,
  "intermediate_size": 64,
  "num_hidden_layers": 1,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "vocab_size": 1216,
  "max_position_embeddings": 32768,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "tie_word_embeddings": true,
  "bos_token_id": 0,
  "eos_token_id": 2,
  "initializer_range": 0.02
}
EOF
echo "some text" > "$tmp/init.txt"
"$bin" train --init "$tmp/tiny.json" --data "$tmp/init.txt" --steps 1 --batch 1 --seq 8 --device cpu \
  --out "$tmp/init" > "$tmp/init.log" 2>&1 || { cat "$tmp/init.log"; fail "making the tiny model"; }
mkdir -p "$model"
cp "$tmp/init/checkpoints/step_00000001/config.json" "$tmp/init/checkpoints/step_00000001/model.safetensors" "$model/"
cp "$src/tests/fixtures/tokenizers/qwen2/tokenizer.json" "$src/tests/fixtures/tokenizers/qwen2/tokenizer_config.json" "$model/"
# a config alone for each `plan --init X/config.json` (the Qwen2.5-7B shape)
for cfg in $(grep -o -- '--init [^ ]*/config.json' "$tmp/recipe.sh" | cut -d' ' -f2 | sort -u); do
  mkdir -p "$(dirname "$cfg")"
  cp "$src/configs/qwen2.5-7b.json" "$cfg"
done
# chat.jsonl: generated conversations, some with a system message, some of two turns
for i in $(seq 1 200); do
  a=$((i % 17)) b=$((i % 11))
  if ((i % 3 == 0)); then
    printf '{"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is %d plus %d?"}, {"role": "assistant", "content": "%d plus %d is %d."}]}\n' $a $b $a $b $((a + b))
  else
    printf '{"messages": [{"role": "user", "content": "Name a number above %d."}, {"role": "assistant", "content": "%d."}, {"role": "user", "content": "And below %d?"}, {"role": "assistant", "content": "%d."}]}\n' $a $((a + 1)) $b $((b - 1))
  fi
done > chat.jsonl

# ---- run it as written ----
export PATH="$(cd "$(dirname "$bin")" && pwd):$PATH"
[ "$(command -v megatrain)" -ef "$bin" ] || fail "megatrain on PATH is not $bin"
echo "--- running it in $work"
set +e
bash -e "$tmp/recipe.sh" > "$tmp/recipe.log" 2>&1
rc=$?
set -e
cat "$tmp/recipe.log"
[ $rc -eq 0 ] || fail "the recipe exited $rc"

# ---- what it says it wrote ----
steps=$(grep -m1 -o -- '--steps [0-9]*' "$tmp/recipe.sh" | cut -d' ' -f2)
out=$(grep -m1 -o -- '--out [^ ]*' "$tmp/recipe.sh" | cut -d' ' -f2)
ckpt=$(printf '%s/checkpoints/step_%08d' "$out" "$steps")
for f in config.json model.safetensors tokenizer.json; do
  [ -f "$ckpt/$f" ] || fail "no $ckpt/$f after the recipe"
done
grep -qF "last checkpoint: $ckpt" "$tmp/recipe.log" || fail "the recipe's run did not end at $ckpt"
if grep -q -- '--resume' "$tmp/recipe.sh"; then
  grep -qF "resuming from $ckpt" "$tmp/recipe.log" || fail "the --resume command did not resume from $ckpt"
fi

# ---- the transformers snippet ----
if blocks recipe-python python > "$tmp/load.py"; then
  grep -qF "$ckpt" "$tmp/load.py" || fail "the transformers snippet does not load $ckpt"
  if python3 -c 'import transformers, torch' 2>/dev/null; then
    echo "--- the transformers snippet"
    (cd "$work" && python3 "$tmp/load.py") || fail "the transformers snippet failed"
  else
    echo "SKIPPED the transformers snippet: python3 cannot import transformers and torch here"
  fi
else
  fail "no \`\`\`python block after <!-- recipe-python --> in README.md"
fi

# ---- links and paths in the user docs ----
bad=0
for doc in "$src/README.md" "$src"/docs/*.md; do
  dir=$(dirname "$doc")
  # markdown links [text](target), relative ones only
  while IFS= read -r target; do
    t=${target%%#*}
    [ -z "$t" ] && continue
    case $t in http://* | https://* | mailto:*) continue ;; esac
    [ -e "$dir/$t" ] || { echo "${doc#$src/}: link to a missing file: $target" >&2; bad=1; }
  done < <(grep -o '\](\([^)]*\))' "$doc" | sed 's/^](\(.*\))$/\1/')
  # `src/...`-style paths in backticks: a file, a directory, or a test/tool named without its suffix
  while IFS= read -r p; do
    p=${p%/}
    case $p in *'*'* | *'<'* | *'%'* | *'...') continue ;; esac
    if [ -e "$src/$p" ] || compgen -G "$src/$p.*" > /dev/null; then continue; fi
    echo "${doc#$src/}: names a missing path: $p" >&2
    bad=1
  done < <(grep -o '`\(src\|tests\|bench\|scripts\|configs\|docs\|cmake\)/[A-Za-z0-9_./-]*' "$doc" | sed 's/^`//')
done
[ $bad -eq 0 ] || fail "README.md or docs/ name paths that do not exist (above)"
echo "test_readme_recipe: PASS"
