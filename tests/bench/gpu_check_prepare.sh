#!/usr/bin/env bash
# Prepares the offline GPU check (tests/bench/gpu_check.sh) HERE, on a machine that reaches PyPI.
# Writes into $GPU_CHECK_DIR (default .gpu_check, in the repository root, git-ignored through
# .git/info/exclude so that no `git add -A` picks it up, without touching the shared .gitignore):
#
#   llama_cpp_python-0.3.36-dgchatN-slim.tar.xz   the patched llama.cpp sources + llama_cpp package
#                                                 (engine/build.py --slim-source; ~2 MB; cached)
#   wheels/*.whl                                  Python 3.12 manylinux x86_64 wheels of what the
#                                                 device image lacks or has too old (KINDS.md's list)
#
# and prints the device `run` call to make. llama-cpp-python itself never travels as a wheel: its
# library is built there from the archive.
#
#   bash tests/bench/gpu_check_prepare.sh          # PYTHON=... to choose the interpreter
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
DIR=${GPU_CHECK_DIR:-.gpu_check}
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY=$ROOT/.venv/bin/python
else PY=python3; fi

# Wheels for the device (Python 3.12.3, numpy 2.5, torch 2.11, transformers 5.17, tokenizers 0.23.2,
# huggingface-hub 1.33, safetensors 0.8, jinja2, rich, pyyaml, requests, tqdm, threadpoolctl there):
#   transformers  5.23 has DiffusionGemma (the reference of the equivalence tests); the image's 5.17 has not
#   gguf          dgchat's GGUF reader/writer (not in the image)
#   diskcache     imported by `import llama_cpp` (llama_cache.py; not in the image)
#   platformdirs  dgchat.paths (the `dgchat generate` CLI test; not in the image)
#   regex         transformers checks regex>=2025.10.22 at import; the image's version is not recorded
pin() {  # the version pyproject.toml pins, else the one installed here
    "$PY" - "$1" <<'EOF'
import re, sys
name = sys.argv[1]
text = open("pyproject.toml").read()
m = re.search(r'"%s==([^"]+)"' % re.escape(name), text)
if m:
    print(m.group(1))
else:
    from importlib.metadata import version
    print(version(name))
EOF
}
WHEELS=(
    "transformers==$(pin transformers)"
    "gguf==$(pin gguf)"
    "platformdirs==$(pin platformdirs)"
    "diskcache==5.6.3"
    "regex==$(pin regex)"
)

mkdir -p "$DIR/wheels"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$DIR/" "$exclude" 2>/dev/null || echo "/$DIR/" >> "$exclude"

# 1. the slim source archive (engine/build.py caches it; only the copy here is replaced)
rm -f "$DIR"/llama_cpp_python-*-slim.tar.*
"$PY" engine/build.py --slim-source "$DIR/"

# 2. the wheels (one version of each: two would stop the install there)
rm -f "$DIR"/wheels/*.whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR/wheels" "${WHEELS[@]}"
ls -l "$DIR" "$DIR/wheels"

# 3. what travels: tracked + untracked-not-ignored files, plus the carried folder (limit 64 MiB)
tree_bytes=$( { git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true; } \
              | awk '{s += $1} END {print s + 0}')
carry_bytes=$(du -sb "$DIR" | cut -f1)
total=$(( tree_bytes + carry_bytes ))
awk -v t="$tree_bytes" -v c="$carry_bytes" -v d="$DIR" 'BEGIN {
    printf "travels: working tree %.1f MiB + %s %.1f MiB = %.1f MiB (limit 64 MiB)\n", t / 1048576, d, c / 1048576, (t + c) / 1048576 }'
if (( total > 64 * 1048576 )); then
    echo "too large for the device tool: drop something from $DIR or the working tree" >&2
    exit 1
fi

cat <<EOF

Ready. On a session that has a GPU (the device tool's status: can_start_another true), make ONE call:

  run(command="bash tests/bench/gpu_check.sh", carry=["$DIR"], timeout_s=600)

Knobs go in front of the command, e.g. "CUDA_FA=OFF BENCH_STEPS=16,32 bash tests/bench/gpu_check.sh"
(tests/bench/gpu_check.sh lists them). Results come back as summary.txt, build.log, sanity.log,
tests.log, junit.xml, make.log, bench.log, bench.json; then call give_back unless rerunning at once.
EOF
