#!/usr/bin/env bash
# The offline GPU check. Runs ON a CUDA machine with no network (the device tool's H200), from the
# repository root, over what tests/bench/gpu_check_prepare.sh put into the carried folder:
#
#   .gpu_check/llama_cpp_python-0.3.36-dgchatN-slim.tar.xz   patched llama.cpp + llama_cpp (engine/build.py --slim-source)
#   .gpu_check/wheels/*.whl                                   Python packages the machine lacks
#
# Stages (each cut to what is left of the whole budget, so a stuck one cannot eat the rest):
#   build   unpack the archive to /tmp, CMake + ninja: libllama, ggml (CPU + CUDA, CUDA_ARCH only),
#           llama-diffusion-cli; install the wheels to a --target folder; dgchat importable through
#           a symlink; LLAMA_CPP_LIB_PATH -> the build. The full-shape GGUF is written meanwhile.
#   sanity  patch level, gpu_offload, a tiny model with every layer on the GPU (gpu_check_sanity.py)
#   tests   DiffusionGemma equivalence tests with every layer on the GPU (DGCHAT_TEST_GPU_LAYERS)
#   bench   tests/bench/bench_dg_fullshape.py on the 30-layer random full-shape GGUF
#   bench-ram  the same with every layer's routed experts kept in RAM (--experts-on cpu; steps 16,48),
#           then its graph splits (bench_device_splits.py --planned --experts-on cpu)
#   splits  tests/bench/bench_device_splits.py: graph splits per step, ops left on the CPU (into bench.log)
# Logs and results go to $OUT (the device tool brings back at most 8 files; this writes 8):
#   summary.txt build.log sanity.log tests.log junit.xml make.log bench.log bench.json
#
# Knobs (environment), defaults in brackets:
#   CUDA_ARCH [90-real: sm_90 machine code only, no PTX]  CUDA_FA [ON: flash-attention kernels; OFF
#   compiles them as stubs]. Measured on the device tool's H200 (16 cores, CUDA 13.0, 2026-12-04): the
#   build takes 253 s with CUDA_FA=ON, 227 s with OFF; the 30-layer GGUF is written in 40 s meanwhile.
#   BUDGET_S [565]  wall-clock budget of the whole script; keep it under the run's timeout_s
#   T_BUILD [330] T_SANITY [60] T_TESTS [200] T_MAKE [330] T_BENCH [240] T_SPLITS [60]  caps per stage (s)
#   STAGES ["sanity tests bench splits"]  run in the order given (build always runs first)   GPU_CHECK_DIR [.gpu_check]
#   TESTS ["tests/model_backend/test_diffusion_gemma_numerics.py tests/model_backend/test_diffusion_gemma_sampler.py tests/model_backend/test_backend_sampler.py"]  PYTEST_ARGS []
#   BENCH_MODEL [/tmp/gpu_check/dg-fullshape-L30-q4_0.gguf] BENCH_LAYERS [30] BENCH_QTYPE [q4_0]
#   MAKE_ARGS [] (extra make_fullshape_dg.py flags)   BENCH_STEPS [16,24,32,48]  BENCH_ARGS []
#   BUILD_TARGETS ["llama llama-diffusion-cli"]  EXTRA_CMAKE_ARGS []
#   CUDA [ON; OFF = a CPU-only dry run of the whole script, e.g. on a dev machine]
#   GPU_CHECK_WORK [/tmp/gpu_check]  GPU_CHECK_SRC / GPU_CHECK_BUILD: an unpacked archive / a build
#   folder to use instead of the ones under GPU_CHECK_WORK (reruns; a dry run over an existing build)
# CUDA libraries: the toolkit's; where it has no cuBLAS (an nvcc-only toolkit), the pip package that
# PyTorch brings (site-packages/nvidia/cu13), and where it has no libcuda stub, the driver's libcuda.
# A CPU-only dry run on a dev machine (no GPU; the sanity stage then reports "cannot offload"):
#   CUDA=OFF MAKE_ARGS=--tiny BENCH_STEPS=2 BENCH_ARGS="--ar-tokens 4" bash tests/bench/gpu_check.sh
{  # the whole script is read before it runs: editing it during a run cannot change that run
set -u
START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
rm -f "$OUT"/{summary.txt,build.log,sanity.log,tests.log,junit.xml,make.log,bench.log,bench.json}
DIR=${GPU_CHECK_DIR:-.gpu_check}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
CUDA_ARCH=${CUDA_ARCH:-90-real}
CUDA_FA=${CUDA_FA:-ON}
CUDA=${CUDA:-ON}
BUDGET_S=${BUDGET_S:-565}
T_BUILD=${T_BUILD:-330}; T_SANITY=${T_SANITY:-60}; T_TESTS=${T_TESTS:-200}; T_MAKE=${T_MAKE:-330}; T_BENCH=${T_BENCH:-240}
T_SPLITS=${T_SPLITS:-60}
STAGES=${STAGES:-sanity tests bench splits bench-ram}
TESTS=${TESTS:-tests/model_backend/test_diffusion_gemma_numerics.py tests/model_backend/test_diffusion_gemma_sampler.py tests/model_backend/test_backend_sampler.py}
PYTEST_ARGS=${PYTEST_ARGS:-}
BENCH_LAYERS=${BENCH_LAYERS:-30}; BENCH_QTYPE=${BENCH_QTYPE:-q4_0}; BENCH_STEPS=${BENCH_STEPS:-16,24,32,48}
BENCH_MODEL=${BENCH_MODEL:-$WORK/dg-fullshape-L${BENCH_LAYERS}-${BENCH_QTYPE}.gguf}
MAKE_ARGS=${MAKE_ARGS:-}; BENCH_ARGS=${BENCH_ARGS:-}; EXTRA_CMAKE_ARGS=${EXTRA_CMAKE_ARGS:-}
BUILD_TARGETS=${BUILD_TARGETS:-llama llama-diffusion-cli}
PY=${PYTHON:-python3}
RESERVE=12  # seconds kept back for the summary
NPROC=$(nproc 2>/dev/null || echo 8)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONFAULTHANDLER=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DGCHAT_TEST_GPU_LAYERS=${DGCHAT_TEST_GPU_LAYERS:-999}  # tests/fixtures/dg_engine.py: every layer on the GPU

declare -A STATUS SECS
ORDER=()
WORKAROUND=
log() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - START) - RESERVE )); }
cap() {  # cap WANT: the stage's timeout, never beyond the budget
    local want=$1 l
    l=$(left)
    (( l < want )) && want=$l
    (( want < 1 )) && want=1
    echo "$want"
}
record() {  # record STAGE RC SECONDS
    local s=$1 rc=$2
    ORDER+=("$s")
    SECS[$s]=$3
    if (( rc == 0 )); then STATUS[$s]=ok
    elif (( rc == 124 || rc == 137 )); then STATUS[$s]="TIMEOUT"
    else STATUS[$s]="FAILED (rc $rc)"; fi
}
skip() { ORDER+=("$1"); STATUS[$1]="skipped: $2"; SECS[$1]=0; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
run_stage() {  # run_stage NAME CAP LOGFILE CMD...: timed, output to LOGFILE and stdout
    local name=$1 t s rc
    t=$(cap "$2"); local logf=$3; shift 3
    log "stage $name (timeout ${t}s): $*"
    s=$(date +%s)
    set -o pipefail
    timeout -k 10 "$t" "$@" 2>&1 | tee -a "$logf"
    rc=$?
    set +o pipefail
    record "$name" "$rc" $(( $(date +%s) - s ))
    log "stage $name: ${STATUS[$name]} after ${SECS[$name]}s"
    return "$rc"
}

# -- setup: archive, wheels, import paths -----------------------------------------------------------
ARCHIVE=$(ls "$DIR"/llama_cpp_python-*-slim.tar.* 2>/dev/null | head -n 1)
if [[ -z "$ARCHIVE" ]]; then
    echo "no slim archive in $DIR: run tests/bench/gpu_check_prepare.sh first (and carry $DIR)" | tee "$OUT/summary.txt"
    exit 2
fi
mkdir -p "$WORK"
KEY=$(sha256sum "$ARCHIVE" | cut -c1-16)
if [[ -n "${GPU_CHECK_SRC:-}" ]]; then
    SLIM=${GPU_CHECK_SRC%/}
else
    SRC_PARENT=$WORK/src-$KEY
    if [[ ! -f "$SRC_PARENT/done" ]]; then
        rm -rf "$SRC_PARENT"; mkdir -p "$SRC_PARENT"
        "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
            "$ARCHIVE" "$SRC_PARENT" && touch "$SRC_PARENT/done"
    fi
    SLIM=$(ls -d "$SRC_PARENT"/*/ | head -n 1); SLIM=${SLIM%/}
fi
MANIFEST=$SLIM/DGCHAT_SLIM.json
mf() { "$PY" -c 'import json, sys; v = json.load(open(sys.argv[1]))[sys.argv[2]]; print(" ".join(v) if isinstance(v, list) else v)' "$MANIFEST" "$1"; }
PATCH_LEVEL=$(mf patch_level)
CMAKE_SRC=$SLIM/$(mf cmake_source_dir)
log "archive $ARCHIVE (sha256 $KEY...), local version $(mf local_version), patch level $PATCH_LEVEL"

SITE=$WORK/site
if ls "$DIR"/wheels/*.whl >/dev/null 2>&1; then
    rm -rf "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$DIR"/wheels/*.whl \
        > "$OUT/build.log" 2>&1 || log "WARNING: installing the carried wheels failed (see build.log)"
fi
mkdir -p "$WORK/py"
ln -sfn "$ROOT" "$WORK/py/dgchat"   # the repository root is the `dgchat` package
export PYTHONPATH="$WORK/py:$SITE:$SLIM${PYTHONPATH:+:$PYTHONPATH}"

# -- the full-shape GGUF, written while the engine compiles ----------------------------------------
MAKE_PID=
if want bench; then
    if [[ -f "$BENCH_MODEL.done" ]]; then
        log "reusing $BENCH_MODEL"
    else
        t=$(cap "$T_MAKE")
        log "writing $BENCH_MODEL in the background (timeout ${t}s)"
        MAKE_START=$(date +%s)
        # shellcheck disable=SC2086
        ( exec timeout -k 10 "$t" "$PY" tests/bench/make_fullshape_dg.py "$BENCH_MODEL" \
              --layers "$BENCH_LAYERS" --qtype "$BENCH_QTYPE" $MAKE_ARGS > "$OUT/make.log" 2>&1 ) &
        MAKE_PID=$!
    fi
fi

# -- build -----------------------------------------------------------------------------------------
NVCC=
[[ $CUDA == ON ]] && NVCC=$(command -v nvcc || true)
[[ $CUDA == ON ]] && for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [[ -z "$NVCC" && -x "$c" ]] && NVCC=$c
done
CMAKE_CUDA=()
LIBDIRS=
if [[ $CUDA == ON ]]; then
    CMAKE_CUDA+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" "-DGGML_CUDA_FA=$CUDA_FA" -DGGML_CUDA_NCCL=OFF)
else
    CMAKE_CUDA+=(-DGGML_CUDA=OFF)
fi
if [[ -n "$NVCC" ]]; then
    if [[ -z "${CUDA_HOME:-}" ]]; then  # the toolkit: beside nvcc, else /usr/local/cuda
        CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
        [[ -f $CUDA_HOME/include/cuda_runtime.h || ! -d /usr/local/cuda ]] || CUDA_HOME=$(readlink -f /usr/local/cuda)
    fi
    CMAKE_CUDA+=("-DCMAKE_CUDA_COMPILER=$NVCC")
    # cuBLAS: the toolkit's, else the pip package PyTorch brings (nvidia/cu13 or nvidia/cublas)
    if ! ls "$CUDA_HOME"/include/cublas_v2.h "$CUDA_HOME"/targets/*/include/cublas_v2.h >/dev/null 2>&1; then
        CUBLAS=$("$PY" -c '
import glob, os, sys
for p in sys.path:
    for h in sorted(glob.glob(os.path.join(p, "nvidia", "*", "include", "cublas_v2.h"))):
        print(os.path.dirname(os.path.dirname(h))); raise SystemExit' 2>/dev/null)
        if [[ -n "$CUBLAS" ]]; then
            lib=$(ls "$CUBLAS"/lib/libcublas.so* | head -n 1); lt=$(ls "$CUBLAS"/lib/libcublasLt.so* | head -n 1)
            log "cuBLAS from $CUBLAS (not in $CUDA_HOME)"
            CMAKE_CUDA+=("-DCUDA_cublas_LIBRARY=$lib" "-DCUDA_cublasLt_LIBRARY=$lt"
                         "-DCMAKE_CUDA_FLAGS=-I$CUBLAS/include" "-DCMAKE_CXX_FLAGS=-I$CUBLAS/include")
            LIBDIRS=$CUBLAS/lib
        fi
    fi
    # the driver library: the toolkit's stub, else the driver's own
    if ! ls "$CUDA_HOME"/lib64/stubs/libcuda.so "$CUDA_HOME"/targets/*/lib/stubs/libcuda.so >/dev/null 2>&1; then
        drv=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so/ {print $NF; exit}')
        [[ -z "$drv" ]] && drv=$(ls /usr/local/nvidia/lib64/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so* 2>/dev/null | head -n 1)
        [[ -n "$drv" ]] && CMAKE_CUDA+=("-DCUDA_cuda_driver_LIBRARY=$drv")
    fi
fi
BUILD=${GPU_CHECK_BUILD:-$WORK/build-$KEY-cuda$CUDA-sm$CUDA_ARCH-fa$CUDA_FA}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
{ echo "nvcc: ${NVCC:-none}"; [[ -n "$NVCC" ]] && "$NVCC" --version | tail -n 2; cmake --version | head -n 1; } >> "$OUT/build.log" 2>&1
# shellcheck disable=SC2046,SC2086
run_stage configure 90 "$OUT/build.log" cmake -S "$CMAKE_SRC" -B "$BUILD" ${GEN[@]+"${GEN[@]}"} -DCMAKE_BUILD_TYPE=Release \
    $(mf cmake_args) "${CMAKE_CUDA[@]}" $EXTRA_CMAKE_ARGS
BUILD_RC=$?
if (( BUILD_RC == 0 )); then
    # shellcheck disable=SC2086
    run_stage build "$T_BUILD" "$OUT/build.log" cmake --build "$BUILD" --target $BUILD_TARGETS -j "$NPROC"
    BUILD_RC=$?
    ls -l "$BUILD"/bin >> "$OUT/build.log" 2>&1
else
    skip build "configure ${STATUS[configure]}"
fi
export LLAMA_CPP_LIB_PATH=$BUILD/bin
export LD_LIBRARY_PATH="$BUILD/bin${LIBDIRS:+:$LIBDIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# -- the stages after the build, in the order STAGES names them --------------------------------------
wait_writer() {  # the full-shape GGUF writer, if it is still running (its own timeout ends it)
    [[ -z "$MAKE_PID" ]] && return
    log "waiting for the GGUF writer"
    wait "$MAKE_PID"; local rc=$?
    MAKE_PID=
    record make "$rc" $(( $(date +%s) - MAKE_START ))
    (( rc == 0 )) && touch "$BENCH_MODEL.done"
    tail -n 3 "$OUT/make.log" 2>/dev/null
}
stage_sanity() {
    local check=(tests/bench/gpu_check_sanity.py --expect-patch-level "$PATCH_LEVEL") dbg exe
    { nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || true; } >> "$OUT/sanity.log"
    run_stage sanity "$T_SANITY" "$OUT/sanity.log" "$PY" "${check[@]}"
    [[ ${STATUS[sanity]} == "FAILED (rc 139)" ]] || return
    dbg=$(command -v gdb || command -v cuda-gdb || true)
    if [[ -n $dbg ]]; then
        exe=$("$PY" -c 'import sys; print(sys.executable)' 2>/dev/null)  # not a wrapper script (pyenv shims)
        # the native stack of a segfault, once: a Python traceback stops at the ctypes call
        log "sanity segfaulted: its backtrace under $(basename "$dbg") (into sanity.log)"
        timeout -k 5 "$(cap 60)" "$dbg" -q -batch -ex "set pagination off" -ex run -ex bt -ex "x/3i \$pc" \
            --args "${exe:-$PY}" "${check[@]}" 2>&1 | grep -E "^#[0-9]|signal SIG|^=> " | head -n 24 >> "$OUT/sanity.log"
    fi
    load_order_workaround "${check[@]}"
}
load_order_workaround() {  # load_order_workaround SANITY_ARGS...
    # The first GPU day's crash (README, "First GPU day"): every model load segfaulted in
    # llama_model::print_info unless llama.cpp's library was loaded before numpy. library.py now
    # puts libstdc++ into the global scope first; if the sanity stage still segfaults, that was not
    # enough, and the two process-wide forms are tried in turn. The first that loads stays set for
    # the stages after it, so they still measure something, and the summary names it ("loads":
    # the retry reached its verdict, 0 ok or 1 a PROBLEM line, instead of dying).
    local preload="libstdc++.so.6${LD_PRELOAD:+:$LD_PRELOAD}"
    local engine_first="$WORK/engine_first:$PYTHONPATH"
    log "sanity segfaulted: trying libstdc++ preloaded (LD_PRELOAD)"
    LD_PRELOAD=$preload run_stage sanity+preload "$T_SANITY" "$OUT/sanity.log" "$PY" "$@"
    if (( $? <= 1 )); then
        export LD_PRELOAD=$preload
        WORKAROUND="LD_PRELOAD=libstdc++.so.6 (library.py's RTLD_GLOBAL promotion was not enough)"
        return
    fi
    # llama.cpp's library loaded before numpy, in every Python process (dgchat's CLI runs included):
    # a sitecustomize on PYTHONPATH that imports llama_cpp (the order that loaded on the H200)
    mkdir -p "$WORK/engine_first"
    printf 'import llama_cpp  # gpu_check.sh: llama.cpp before numpy (the load-order crash)\n' \
        > "$WORK/engine_first/sitecustomize.py"
    log "sanity segfaulted again: trying llama.cpp loaded before numpy (sitecustomize)"
    PYTHONPATH=$engine_first run_stage sanity+engine-first "$T_SANITY" "$OUT/sanity.log" "$PY" "$@"
    if (( $? <= 1 )); then
        export PYTHONPATH=$engine_first
        WORKAROUND="llama_cpp imported before numpy by a sitecustomize (neither RTLD_GLOBAL nor LD_PRELOAD was enough)"
    fi
}
stage_tests() {  # (b) the equivalence tests with every layer on the GPU
    # shellcheck disable=SC2086
    run_stage tests "$T_TESTS" "$OUT/tests.log" "$PY" -m pytest -p no:cacheprovider \
        -q -rfEs --durations=8 --junitxml="$OUT/junit.xml" $TESTS $PYTEST_ARGS
}
stage_bench() {  # (c) the full-shape bench
    wait_writer
    if [[ -f "$BENCH_MODEL.done" ]]; then
        # shellcheck disable=SC2086
        run_stage bench "$T_BENCH" "$OUT/bench.log" "$PY" tests/bench/bench_dg_fullshape.py --model "$BENCH_MODEL" \
            --steps "$BENCH_STEPS" --json "$OUT/bench.json" $BENCH_ARGS
    else
        skip bench "no full-shape GGUF (writer ${STATUS[make]:-not run}; see make.log)"
    fi
}
stage_bench-ram() {  # (d) experts in RAM: what a 12 GB card's split costs per step, and its splits
    wait_writer
    if [[ -f "$BENCH_MODEL.done" ]]; then
        # shellcheck disable=SC2086
        run_stage bench-ram "$T_BENCH" "$OUT/bench.log" "$PY" tests/bench/bench_dg_fullshape.py --model "$BENCH_MODEL" \
            --steps 16,48 --experts-on cpu $BENCH_ARGS  # its table in bench.log: the tool brings back 8 files
        run_stage splits-ram "$T_SPLITS" "$OUT/bench.log" "$PY" tests/bench/bench_device_splits.py \
            --model "$BENCH_MODEL" --steps 2 --planned --experts-on cpu
    else
        skip bench-ram "no full-shape GGUF (writer ${STATUS[make]:-not run}; see make.log)"
    fi
}
stage_splits() {
    # graph splits per denoising step with every layer on the GPU (ops ggml-cuda leaves to the CPU),
    # on the full-shape file (262k vocabulary) when it was written, else the bundled model; appended
    # to bench.log (the device tool brings back 8 files)
    want bench && wait_writer
    local model=assets/dgchat-tiny-plays.gguf
    [[ -f "$BENCH_MODEL.done" ]] && model=$BENCH_MODEL
    run_stage splits "$T_SPLITS" "$OUT/bench.log" "$PY" tests/bench/bench_device_splits.py \
        --model "$model" --steps 2
}
for s in $STAGES; do
    case $s in
        sanity|tests|bench|splits|bench-ram)
            if (( BUILD_RC != 0 )); then skip "$s" "no engine (build ${STATUS[build]})"; else "stage_$s"; fi ;;
        *) log "unknown stage '$s' (STAGES: sanity tests bench splits bench-ram, in any order)" ;;
    esac
done
if [[ -n "$MAKE_PID" ]] && kill -0 "$MAKE_PID" 2>/dev/null; then kill -TERM "$MAKE_PID" 2>/dev/null; wait "$MAKE_PID"; fi

# -- summary -----------------------------------------------------------------------------------------
{
    echo "== dgchat GPU check: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(( $(date +%s) - START ))s of ${BUDGET_S}s"
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo '?')"
    echo "engine: $(mf local_version) from $(basename "$ARCHIVE"), CUDA=$CUDA CUDA_ARCH=$CUDA_ARCH CUDA_FA=$CUDA_FA, $NPROC cores"
    if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
        echo "repo: $(git -C "$ROOT" log -1 --format='%h %s')$( [[ -n $(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1) ]] && echo ' (+ uncommitted changes)')"
    fi
    for s in "${ORDER[@]}"; do printf '%-19s %-40s %5ss\n' "$s" "${STATUS[$s]}" "${SECS[$s]}"; done
    [[ -n $WORKAROUND ]] && echo "load-order workaround in effect for the stages after sanity: $WORKAROUND"
    if [[ -f "$OUT/sanity.log" ]]; then
        echo "-- sanity"; grep -E "^llama-cpp-python|max \|logit|offloaded|PROBLEM|^sanity:|^#[0-9]|signal SIG" "$OUT/sanity.log" | cut -c1-240
    fi
    if [[ -f "$OUT/tests.log" ]]; then
        echo "-- tests"; grep -E "^(FAILED|ERROR|SKIPPED) |(passed|failed|error).* in [0-9.]+s" "$OUT/tests.log" | tail -n 15
    fi
    if [[ -f "$OUT/make.log" ]]; then
        echo "-- make"; tr '\r' '\n' < "$OUT/make.log" | grep -v '^ *$' | tail -n 2
    fi
    if [[ -f "$OUT/bench.log" ]]; then
        echo "-- bench"; grep -E "^engine |^dg-" "$OUT/bench.log"; sed -n '/^configuration/,/^peak RSS/p' "$OUT/bench.log"
        echo "-- splits"; grep -E "^model |^splits per graph|^last graph|^  splits|^nodes on the CPU|^  +[0-9.]+  |^no node on|^weights kept" "$OUT/bench.log"
    fi
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
for s in "${ORDER[@]}"; do [[ ${STATUS[$s]} == ok ]] || exit 1; done
exit 0
}
