#!/usr/bin/env bash
# Runs HERE (network, pip): fills prebuilt/release/ with what the MegaTrain authors' release needs on
# the GPU machine (no network, no pip index), for bench/release_longctx.sh there (issue 11):
#   prebuilt/release/mtref/infinity/   the release's package (github DLYuanGod/MegaTrain, CPUMasterModel)
#   prebuilt/release/COMMIT            the commit it came from
#   prebuilt/release/wheels/*.whl      cp312 manylinux x86_64 wheels the image lacks (below)
#
#   scripts/release-deps.sh GIT_DIR
# GIT_DIR is a bare clone of github:DLYuanGod/MegaTrain. The session's `fetch` tool makes one (it is a
# tool, not a shell command, so this script cannot call it): fetch github:DLYuanGod/MegaTrain answers
# e.g. /work/.mirror/DLYuanGod+MegaTrain/repo. `git clone --bare URL` works as well. Idempotent: a
# wheel already in wheels/ is not fetched again; mtref/ is always re-extracted from GIT_DIR's HEAD.
# prebuilt/ is git-ignored; it travels to the device with `carry: ["prebuilt"]`. KIT (default
# prebuilt/release of this script's tree) puts the kit elsewhere, e.g. into another checkout.
#
# What the wheels are for (the image has torch 2.11, transformers 5.17, numpy, pyyaml):
#   deepspeed 0.19.8   DeepSpeedCPUAdam, the optimizer of the release's examples/sft/train.py. Built
#                      here from its sdist with DS_BUILD_OPS=0: the CPU Adam op compiles itself there
#                      on first use (bench/release_longctx.sh does it once, up front).
#   hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions py-cpuinfo ninja
#   msgpack einops nvidia-ml-py packaging tqdm psutil
#                      deepspeed's requirements (requirements/requirements.txt of its sdist; torch and
#                      numpy are the image's); ninja is the build tool torch's cpp_extension runs.
#   datasets dill multiprocess
#                      what the team carried for the release before. At the release's HEAD `datasets`
#                      is imported only inside load_dataset_by_name / the disk-dataset loader
#                      (infinity/data/datasets.py), which the probe never calls, so `import infinity`
#                      does not need them; pyarrow, pandas, fsspec and xxhash (what `import datasets`
#                      itself pulls in, ~60 MB) are therefore left out on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
git_dir=${1:-}
[ -n "$git_dir" ] && git --git-dir="$git_dir" rev-parse -q --verify HEAD >/dev/null 2>&1 || {
  echo "release-deps: give the release's git dir: scripts/release-deps.sh GIT_DIR (a bare clone of" \
       "github:DLYuanGod/MegaTrain, e.g. what the fetch tool answers: /work/.mirror/DLYuanGod+MegaTrain/repo)" >&2
  exit 1
}
kit=${KIT:-prebuilt/release}
mkdir -p "$kit/wheels"

# (a) the release's source: infinity/ (the package) and its LICENSE, caches and build leftovers dropped
rm -rf "$kit/mtref"
mkdir -p "$kit/mtref"
# git archive names blobs the mirror lacks (aarch64 .so files under csrc/build, outside infinity/)
# on stderr while still writing the tree asked for, so its stderr is filtered, not its status
git --git-dir="$git_dir" archive --format=tar HEAD infinity LICENSE 2> >(grep -v "invalid object" >&2) |
  tar -x -C "$kit/mtref"
find "$kit/mtref" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
[ -f "$kit/mtref/infinity/model/cpu_master.py" ] ||
  { echo "release-deps: $git_dir has no infinity/model/cpu_master.py (not the MegaTrain release?)" >&2; exit 1; }
git --git-dir="$git_dir" rev-parse HEAD > "$kit/COMMIT"

# (b) wheels for CPython 3.12 on manylinux x86_64, each pinned so the kit is reproducible
py=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --only-binary=:all:
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 --platform any --no-deps)
wheels=(hjson==3.1.0 pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.8.0
        typing-inspection==0.4.5 typing-extensions==4.16.0 py-cpuinfo==9.0.0 ninja==1.13.2
        msgpack==1.2.4 einops==0.8.2 nvidia-ml-py==13.615.71 packaging==26.4 tqdm==4.70.1
        psutil==7.2.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
missing=()
for w in "${wheels[@]}"; do
  name=${w%%==*}; ver=${w##*==}
  compgen -G "$kit/wheels/${name//-/_}-${ver}-*.whl" >/dev/null || missing+=("$w")
done
[ ${#missing[@]} -eq 0 ] || pip download -q "${py[@]}" -d "$kit/wheels" "${missing[@]}"

# (c) deepspeed: a pure-Python wheel from its sdist, no ops compiled in (they build there, by JIT)
if ! compgen -G "$kit/wheels/deepspeed-0.19.8-*.whl" >/dev/null; then
  tmp=$(mktemp -d)
  pip download -q --no-deps --no-binary=:all: deepspeed==0.19.8 -d "$tmp"
  DS_BUILD_OPS=0 pip wheel -q --no-deps -w "$kit/wheels" "$tmp"/deepspeed-0.19.8.tar.gz
  rm -rf "$tmp"
fi

n=$(ls "$kit"/wheels/*.whl | wc -l)
[ "$n" -eq $(( ${#wheels[@]} + 1 )) ] ||
  { echo "release-deps: $kit/wheels has $n wheels, expected $(( ${#wheels[@]} + 1 )) (stale files? remove the folder)" >&2; exit 1; }
echo "release-deps: release $(cut -c1-12 "$kit/COMMIT"), $n wheels; kit $(du -sh "$kit" | cut -f1)" \
     "(mtref $(du -sh "$kit/mtref" | cut -f1), wheels $(du -sh "$kit/wheels" | cut -f1))"
