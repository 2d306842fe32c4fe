"""The one thin wrapper over llama-cpp-python's low-level API.

This is the only module in dgchat that imports `llama_cpp` or `ctypes`. Everything above it works
with numpy arrays and plain Python values:

- `LlamaModel`: load a GGUF (GPU offload when the build supports it), vocabulary, metadata.
- `LlamaContext`: a context sized by the caller, decoding token or embedding batches where only the
  requested positions produce logits, logits returned as numpy views of llama.cpp's buffer (no copy
  per position), KV cell removal, causal/non-causal switching, cancellation mid-decode.
- llama.cpp's own log lines are captured in a ring buffer; they reach stderr only when verbose.
- `quantize_model`: llama.cpp's quantizer (`llama_model_quantize`), GGUF in, GGUF out.
- ggml's device registry and llama.cpp's RPC backend (in the default engine build; not with `engine/build.py --no-rpc`):
  `rpc_register_server`, `run_rpc_server`; model_backend/rpc.py checks addresses before these run.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dgchat.model_backend.errors import (
    ContextOverflowError,
    EngineError,
    GenerationCancelled,
    ModelFileError,
)
from dgchat.model_backend.gguf_file import GgufHeader, read_gguf_header
from dgchat.model_backend.params import check_threads
from dgchat.model_backend.sampling import RowStats

# ggml's CPU backend parallelises with OpenMP and meets a barrier after every graph node. libgomp's
# default waits there by spinning for a long time: a thread that loses its core to another process
# (the UI thread, a build) stalls every barrier (a 2-thread decode: 820 ms instead of 140 on a loaded
# 2-core machine). Passive waiting (sleeping at once) costs a wake-up per node instead: 56 ms against
# 52 on an idle machine. A short bounded spin is the best of both, measured idle, with one core busy
# and with both busy (52 / 91 / 110-125 ms). Must be set before libgomp loads; the user's values win
# (GOMP_SPINCOUNT only counts while OMP_WAIT_POLICY is unset).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "2000")

try:
    import llama_cpp as _llama
except (ImportError, OSError) as exc:  # a missing or broken shared library
    raise EngineError(f"llama-cpp-python could not be loaded: {exc}") from exc

def set_blas_threads(n: int) -> bool:
    """Threads numpy's BLAS may use from now on (process-wide). False when it cannot be set.

    The samplers' matrix products are small next to a decode (DiffusionGemma's self-conditioning
    on the bundled model: ~0.2 GFLOP a step). A multi-threaded BLAS call is gated by its slowest
    thread, so when another process holds a core it waits a whole time slice: on the 2-core dev
    machine with one core busy, 2 BLAS threads made the bundled model's sampler 229 ms a step
    against 7.6 ms with 1 (and slowed the next llama.cpp decode, 18.6 -> 12.2 ms)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=max(1, int(n)), user_api="blas")
    return True


_LOG_LINES: deque[str] = deque(maxlen=4000)
_log_state: dict = {"verbose": False, "partial": "", "hook": None}
_log_lock = threading.Lock()


@_llama.llama_log_callback
def _on_log(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
    if not text:
        return
    chunk = text.decode("utf-8", errors="replace")
    with _log_lock:
        buf = _log_state["partial"] + chunk
        *lines, _log_state["partial"] = buf.split("\n")
        _LOG_LINES.extend(lines)
    hook = _log_state["hook"]
    if hook is not None:
        try:
            hook(chunk)
        except Exception:  # a progress display must never break llama.cpp's call
            pass
    if _log_state["verbose"]:
        sys.stderr.write(chunk)


_llama.llama_log_set(_on_log, ctypes.c_void_p(0))
_llama.llama_backend_init()


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log lines on stderr (`--verbose`)."""
    _log_state["verbose"] = verbose


def recent_log(n: int = 20) -> list[str]:
    with _log_lock:
        return list(_LOG_LINES)[-n:]


def _last_error_line() -> str:
    """The most specific error llama.cpp logged recently ("error loading model: ..." beats "failed")."""
    lines = [line.strip() for line in recent_log(80)]
    for marker in ("error loading model: ", "error: "):
        for line in reversed(lines):
            if marker in line:
                return line.split(marker, 1)[1].strip()
    for line in reversed(lines):
        low = line.lower()
        if "error" in low or "failed" in low or "exception" in low:
            return line
    return ""


# llama.cpp's quantizer logs "[   3/ 291] blk.0.attn_q.weight - [...]" as it starts each tensor
# (src/llama-quant.cpp, llama_model_quantize_impl); there is no progress callback in its params
_QUANT_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


def quantize_model(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    ftype: str,
    *,
    n_threads: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> None:
    """Run llama.cpp's quantizer: `src` GGUF -> `dst` GGUF of file type `ftype` ("Q4_K_M", ...).

    Every metadata key of `src` is copied (llama.cpp copies the whole KV section and updates
    general.file_type). `progress(i, n, tensor_name)` is called as tensor i of n starts. The call
    runs in a worker thread so that Ctrl-C reaches the caller; llama.cpp itself cannot be
    interrupted, so the worker may still be writing `dst` when KeyboardInterrupt propagates.
    Raises EngineError with llama.cpp's own error line on failure."""
    value = getattr(_llama, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if value is None:
        raise EngineError(f"this llama.cpp has no quantization type {ftype}")
    check_threads(n_threads or None, "threads")  # llama.cpp starts every thread asked for
    params = _llama.llama_model_quantize_default_params()
    params.nthread = int(n_threads or 0)  # 0: all cores
    params.ftype = int(value)
    result: dict[str, int] = {}

    def on_log(chunk: str) -> None:
        m = _QUANT_PROGRESS.search(chunk)
        if m and progress is not None:
            progress(int(m.group(1)), int(m.group(2)), m.group(3))

    def work() -> None:
        result["rc"] = int(_llama.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params)))

    _log_state["hook"] = on_log
    try:
        worker = threading.Thread(target=work, name="llama-quantize", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
    finally:
        _log_state["hook"] = None
    if result.get("rc", 1) != 0:
        raise EngineError(_last_error_line() or "llama_model_quantize failed")


@dataclass(frozen=True)
class EngineInfo:
    llama_cpp_version: str
    gpu_offload: bool
    patch_level: int  # 0: stock llama.cpp; >0: dgchat's patch set (engine/patches)

    @property
    def exact_diffusion_gemma(self) -> bool:
        return self.patch_level > 0

    @property
    def noncontiguous_positions(self) -> bool:
        """Non-causal batches may sit between cached cells (engine/patches/0005), as the dual cache needs."""
        return self.patch_level >= 2

    @property
    def encode_outputs(self) -> bool:
        """Models without KV memory (llada, dream) compute and return logits only for the positions a
        batch asks for (engine/patches/0008); a stock engine returns every position."""
        return self.patch_level >= 3

    @property
    def backend_sampler(self) -> bool:
        """The diffusion head runs the samplers' vocabulary-wide work inside llama.cpp's graph
        (engine/patches/0006, `DiffusionHead`)."""
        return self.patch_level >= 3 and _HEAD is not None

    @property
    def amx_safe(self) -> bool:
        """ggml's AMX weight buffer keeps its tile configuration whatever compiler built the engine
        (engine/patches/0009)."""
        return self.patch_level >= 4


def engine_info() -> EngineInfo:
    lib = _llama.llama_cpp._lib
    level = 0
    fn = getattr(lib, "llama_dgchat_patch_level", None)
    if fn is not None:
        fn.restype = ctypes.c_int32
        fn.argtypes = []
        level = int(fn())
    return EngineInfo(
        llama_cpp_version=getattr(_llama, "__version__", "?"),
        gpu_offload=local_gpu_present(),
        patch_level=level,
    )


# -- ggml's device registry and llama.cpp's RPC backend (engine/build.py, on by default) -------------
# llama-cpp-python no longer wraps RPC (`rpc_servers` is gone), so the few ggml functions needed
# are bound here, from ggml's own libraries (libllama links them). The RPC functions themselves
# are reached the way llama.cpp's common/arg.cpp does: the "RPC" backend's proc addresses.

RPC_MISSING = "this engine was built without RPC: python engine/build.py (without --no-rpc)"
_DEV_CPU, _DEV_GPU, _DEV_IGPU = 0, 1, 2  # enum ggml_backend_dev_type
_RPC_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_RPC_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_void_p))
_GGML_SIGNATURES = {
    "ggml_backend_reg_by_name": (ctypes.c_void_p, [ctypes.c_char_p]),
    "ggml_backend_reg_get_proc_address": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "ggml_backend_reg_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_backend_reg_dev_count": (ctypes.c_size_t, [ctypes.c_void_p]),
    "ggml_backend_reg_dev_get": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
    "ggml_backend_register": (None, [ctypes.c_void_p]),
    "ggml_backend_dev_count": (ctypes.c_size_t, []),
    "ggml_backend_dev_get": (ctypes.c_void_p, [ctypes.c_size_t]),
    "ggml_backend_dev_by_type": (ctypes.c_void_p, [ctypes.c_int]),
    "ggml_backend_dev_type": (ctypes.c_int, [ctypes.c_void_p]),
    "ggml_backend_dev_backend_reg": (ctypes.c_void_p, [ctypes.c_void_p]),
    "ggml_backend_dev_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_backend_dev_description": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_backend_dev_memory": (None, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                       ctypes.POINTER(ctypes.c_size_t)]),
}
_ggml_fns: dict[str, Callable] | None = None
_rpc_lock = threading.Lock()
_rpc_models_alive = 0  # models loaded while RPC servers were registered (each holds its connections)


def _ggml_libraries() -> list[ctypes.CDLL]:
    libs = [_llama.llama_cpp._lib]
    # ggml's libraries sit next to the libllama actually loaded: the package's lib/ folder, or the
    # build folder LLAMA_CPP_LIB_PATH names (the GPU checks). Binding another folder's libggml
    # would list that build's devices, not the ones llama.cpp offloads to.
    loaded = getattr(_llama.llama_cpp._lib, "_name", "") or ""
    lib_dir = Path(loaded).resolve().parent if loaded else Path(_llama.__file__).resolve().parent / "lib"
    try:
        from llama_cpp import _ctypes_extensions

        for name in ("ggml", "ggml-base"):
            try:
                libs.append(_ctypes_extensions.load_shared_library(name, lib_dir))
            except (OSError, RuntimeError, FileNotFoundError):
                pass
    except ImportError:
        pass
    return libs


def _ggml() -> dict[str, Callable]:
    """ggml's registry functions, bound once (they live in libggml / libggml-base)."""
    global _ggml_fns
    if _ggml_fns is None:
        _llama.llama_supports_gpu_offload()  # loads dynamic backends first, as llama.cpp does
        libs = _ggml_libraries()
        fns: dict[str, Callable] = {}
        for name, (restype, argtypes) in _GGML_SIGNATURES.items():
            fn = next((f for lib in libs if (f := getattr(lib, name, None)) is not None), None)
            if fn is None:
                raise EngineError(f"this engine's ggml does not export {name}")
            fn.restype, fn.argtypes = restype, argtypes
            fns[name] = fn
        _ggml_fns = fns
    return _ggml_fns


def _is_rpc_device(dev: int) -> bool:
    g = _ggml()
    name = g["ggml_backend_reg_name"](g["ggml_backend_dev_backend_reg"](dev)) or b""
    return name.startswith(b"RPC")


def cpu_uses_amx() -> bool:
    """Whether this engine's CPU backend would place weights in ggml's AMX buffer (built for, and
    running on, a CPU with AMX-INT8: Intel Sapphire Rapids and later)."""
    info = (_llama.llama_print_system_info() or b"").decode(errors="replace")
    return re.search(r"\bAMX_INT8 = 1\b", info) is not None


def use_extra_buffer_types() -> bool:
    """Whether a model load may use the CPU backend's extra weight buffers (AMX, repacked layouts).

    Not on an AMX CPU unless the engine carries dgchat's patch 0009 (patch level 4): built by GCC
    12, ggml's AMX matrix product drops its tile configuration and every q8_0 model (the bundled
    one, its masked sibling) segfaulted on the first decode (a 2-core Sapphire Rapids VM; upstream
    ggml-org/llama.cpp#20824). A stock llama-cpp-python may have been built by such a compiler, so
    on an AMX CPU it runs the plain CPU kernels. DGCHAT_CPU_EXTRA_BUFFERS=1 or 0 overrides."""
    forced = os.environ.get("DGCHAT_CPU_EXTRA_BUFFERS")
    if forced is not None:
        return forced.strip() not in ("", "0")
    return engine_info().amx_safe or not cpu_uses_amx()


def local_gpu_present() -> bool:
    """A GPU on this machine llama.cpp can offload to. An RPC build's `llama_supports_gpu_offload()`
    says yes on any machine (it counts the RPC backend), so devices are counted here instead."""
    if not _llama.llama_supports_gpu_offload():
        return False
    try:
        g = _ggml()
    except EngineError:
        return True  # no registry to ask: trust llama.cpp
    for i in range(g["ggml_backend_dev_count"]()):
        dev = g["ggml_backend_dev_get"](i)
        if g["ggml_backend_dev_type"](dev) in (_DEV_GPU, _DEV_IGPU) and not _is_rpc_device(dev):
            return True
    return False


def local_gpu_devices() -> list[BackendDevice]:
    """The local GPUs this engine can offload to (none for a CPU-only build; RPC devices excluded)."""
    if not _llama.llama_supports_gpu_offload():
        return []
    try:
        g = _ggml()
    except EngineError:
        return []
    devs = (g["ggml_backend_dev_get"](i) for i in range(g["ggml_backend_dev_count"]()))
    return [_device(d) for d in devs
            if g["ggml_backend_dev_type"](d) in (_DEV_GPU, _DEV_IGPU) and not _is_rpc_device(d)]


def system_info() -> str:
    """llama.cpp's one-line summary of the CPU features and backends it was built for."""
    return (_llama.llama_print_system_info() or b"").decode(errors="replace").strip()


def engine_build_key() -> str:
    """Names this engine build on this machine: a measurement made with one build (its kernels, its
    CPU features, its GPUs) is not reused with another. Built from the llama.cpp library file
    (path, size, modification time), the patch level, llama.cpp's system info and the GPU names."""
    import hashlib

    lib = Path(getattr(_llama.llama_cpp._lib, "_name", "") or "")
    try:
        st = lib.stat()
        ident = f"{lib.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        ident = str(lib)
    info = engine_info()
    gpus = ",".join(f"{d.name}/{d.description}" for d in local_gpu_devices())
    text = "\n".join((ident, info.llama_cpp_version, str(info.patch_level), system_info(), gpus))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _rpc_proc(name: str) -> int | None:
    """The RPC backend's function `name`, or None in an engine built without RPC."""
    try:
        g = _ggml()
    except EngineError:
        return None
    reg = g["ggml_backend_reg_by_name"](b"RPC")
    if not reg:
        return None
    return g["ggml_backend_reg_get_proc_address"](reg, name.encode()) or None


def rpc_supported() -> bool:
    """The engine was built with llama.cpp's RPC backend (the default engine build)."""
    return _rpc_proc("ggml_backend_rpc_add_server") is not None


def require_rpc() -> None:
    if not rpc_supported():
        raise EngineError(RPC_MISSING)


@dataclass(frozen=True)
class BackendDevice:
    name: str  # e.g. RPC0, CPU, CUDA0
    description: str  # an RPC device's is its server's HOST:PORT
    memory_free: int
    memory_total: int


def _device(dev: int) -> BackendDevice:
    g = _ggml()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    g["ggml_backend_dev_memory"](dev, ctypes.byref(free), ctypes.byref(total))
    return BackendDevice(name=(g["ggml_backend_dev_name"](dev) or b"?").decode("utf-8", "replace"),
                         description=(g["ggml_backend_dev_description"](dev) or b"").decode("utf-8", "replace"),
                         memory_free=int(free.value), memory_total=int(total.value))


def rpc_register_server(endpoint: str) -> list[BackendDevice]:
    """Register an RPC server's devices with llama.cpp, as `--rpc` does (ggml_backend_rpc_add_server,
    then ggml_backend_register): every model loaded from now on may place layers on them.

    llama.cpp aborts the process when the server cannot be reached: model_backend/rpc.py greets the
    server first (call `rpc.connect`, not this)."""
    add = _rpc_proc("ggml_backend_rpc_add_server")
    if add is None:
        raise EngineError(RPC_MISSING)
    g = _ggml()
    reg = _RPC_ADD_SERVER(add)(endpoint.encode())
    if not reg:
        # dgchat's engine (patch 0012) logs why ("RPC server H:P closed the connection ...": a failed
        # handshake, a closed connection, garbage, more devices than can be used); a stock one
        # returns null only for a server without devices
        said = [line.strip() for line in recent_log(40) if line.strip().startswith(f"RPC server {endpoint} ")]
        why = said[-1][len(f"RPC server {endpoint} "):] if said else "offers no devices"
        raise EngineError(f"llama.cpp could not register RPC server {endpoint}: it {why}")
    with _rpc_lock:
        g["ggml_backend_register"](reg)
    return [_device(g["ggml_backend_reg_dev_get"](reg, i)) for i in range(g["ggml_backend_reg_dev_count"](reg))]


def rpc_devices() -> list[BackendDevice]:
    """The registered RPC servers' devices (each query asks its server for free memory)."""
    try:
        g = _ggml()
    except EngineError:
        return []
    devs = (g["ggml_backend_dev_get"](i) for i in range(g["ggml_backend_dev_count"]()))
    return [_device(d) for d in devs if _is_rpc_device(d)]


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_abort_note: dict[str, object] = {"line": None, "code": 2, "callback": None}
_ABORT_LOCATION = re.compile(r"^\S+?:\d+: ")  # ggml_abort's "file.cpp:123: " before the message


def abort_detail(message: str) -> str:
    """ggml_abort's message without its source location, on one line."""
    return " ".join(_ABORT_LOCATION.sub("", message.strip()).split())


@_ABORT_CALLBACK
def _on_ggml_abort(message: bytes | None) -> None:
    # ggml calls abort() right after this returns: say it in one line and end the process with
    # dgchat's error status instead of a core dump and a debugger's backtrace
    detail = abort_detail((message or b"").decode("utf-8", errors="replace"))
    try:
        line = _abort_note["line"](detail)  # type: ignore[operator]
    except Exception:  # never let a formatting problem turn this into the crash it explains
        line = f"dgchat: error: llama.cpp stopped the process ({detail})"
    os.write(2, f"\n{line}\n".encode("utf-8", errors="replace"))
    os._exit(int(_abort_note["code"]))  # type: ignore[arg-type]


def explain_engine_aborts(line: str | Callable[[str], str], exit_code: int = 2) -> None:
    """From now on a fatal llama.cpp error (GGML_ABORT) ends the process with one line and `exit_code`.

    `line` is the whole line, or makes it from llama.cpp's message (without its source location).
    The RPC client aborts when a server goes away or lies mid-generation (its callers cannot take an
    error), and the RPC server on what its kernels assert: nothing keeps the process alive then, but
    the user gets a reason instead of a crash dump. GGML_NO_BACKTRACE stops ggml's other way of dying
    loudly (a C++ exception reaching std::terminate runs gdb on the process for a backtrace)."""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    try:
        setter = next(f for lib in _ggml_libraries() if (f := getattr(lib, "ggml_set_abort_callback", None)))
    except StopIteration:
        return
    setter.restype, setter.argtypes = ctypes.c_void_p, [_ABORT_CALLBACK]
    _abort_note["line"] = line if callable(line) else (lambda detail: f"dgchat: error: {line} (llama.cpp: {detail})")
    _abort_note["code"] = exit_code
    _abort_note["callback"] = _on_ggml_abort
    setter(_on_ggml_abort)


def _rpc_in_use() -> bool:
    with _rpc_lock:
        return _rpc_models_alive > 0


_RPC_SET_TIMEOUTS = ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_double)


def set_rpc_server_timeouts(idle_s: float, model_idle_s: float) -> bool:
    """How long `run_rpc_server` waits for a client (engine patch 0012; 0: no limit): `idle_s` before
    its greeting, inside a request and between requests while it holds no memory on the server;
    `model_idle_s` between requests while it holds memory. False: this engine cannot bound them."""
    fn = _rpc_proc("ggml_backend_rpc_dgchat_set_server_timeouts")
    if fn is None:
        return False
    _RPC_SET_TIMEOUTS(fn)(float(idle_s), float(model_idle_s))
    return True


def run_rpc_server(endpoint: str, *, n_threads: int, use_gpu: bool = True, cache_dir: str | None = None,
                   started: Callable[[list[BackendDevice]], None] | None = None) -> None:
    """Serve this machine's devices to llama.cpp RPC clients at `endpoint` ("IPv4:PORT"), as
    upstream's rpc-server does: the local GPUs (when `use_gpu` and there are any), else the CPU.
    Blocks until the server fails; returns after llama.cpp printed why (e.g. the port is taken)."""
    start = _rpc_proc("ggml_backend_rpc_start_server")
    if start is None:
        raise EngineError(RPC_MISSING)
    g = _ggml()
    devs = [g["ggml_backend_dev_get"](i) for i in range(g["ggml_backend_dev_count"]())]
    chosen = [d for d in devs if use_gpu and g["ggml_backend_dev_type"](d) in (_DEV_GPU, _DEV_IGPU)
              and not _is_rpc_device(d)]
    if not chosen:
        cpu = g["ggml_backend_dev_by_type"](_DEV_CPU)
        if not cpu:
            raise EngineError("llama.cpp found no CPU device to serve")
        chosen = [cpu]
    if started is not None:
        started([_device(d) for d in chosen])
    array = (ctypes.c_void_p * len(chosen))(*chosen)
    _RPC_START_SERVER(start)(endpoint.encode(), cache_dir.encode() if cache_dir else None,
                             max(1, n_threads), len(chosen), array)


# -- dgchat's diffusion head (engine/patches/0006) ------------------------------------------------
# The vocabulary-wide part of a denoising step, computed in llama.cpp's graph on the device that
# computed the logits: per output row the drawn token, the argmax, the entropy and three
# probabilities come back instead of the row's logits (see llama_dgchat_head_* in the patched llama.h).

HEAD_RESULTS = 6
_GGML_TYPES = {"f32": 0, "f16": 1, "bf16": 30}  # enum ggml_type


class _HeadParams(ctypes.Structure):
    _fields_ = [
        ("self_cond", ctypes.c_bool),
        ("n_slots", ctypes.c_int32),
        ("soft_top_k", ctypes.c_int32),
        ("embd_t_type", ctypes.c_int),
        ("embed_scale", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("n_inter", ctypes.c_int32),
        ("w_type", ctypes.c_int),
        ("pre_norm", ctypes.c_void_p),
        ("gate", ctypes.c_void_p),
        ("up", ctypes.c_void_p),
        ("down", ctypes.c_void_p),
    ]


class _HeadBatch(ctypes.Structure):
    _fields_ = [
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("margin", ctypes.c_bool),
        ("n_rows", ctypes.c_int32),
        ("inv_temp", ctypes.c_void_p),
        ("uniform", ctypes.c_void_p),
        ("bias_row", ctypes.c_void_p),
        ("sc_write", ctypes.c_void_p),
        ("n_tokens", ctypes.c_int32),
        ("sc_read", ctypes.c_void_p),
        ("keep_logits", ctypes.c_bool),
    ]


def _bind_head():
    lib = _llama.llama_cpp._lib
    if getattr(lib, "llama_dgchat_head_prepare", None) is None:
        return None
    sigs = {
        "llama_dgchat_head_init": (ctypes.c_int32, [ctypes.c_void_p, ctypes.POINTER(_HeadParams)]),
        "llama_dgchat_head_set_bias": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]),
        "llama_dgchat_head_prepare": (ctypes.c_int32, [ctypes.c_void_p, ctypes.POINTER(_HeadBatch)]),
        "llama_dgchat_head_results": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]),
        "llama_dgchat_head_read_slots": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
    }
    fns = {}
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
        fns[name.removeprefix("llama_dgchat_head_")] = fn
    return fns


_HEAD = _bind_head()


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


@dataclass(frozen=True, eq=False)
class SelfConditioningWeights:
    """DiffusionGemma's self-conditioning MLP as the head runs it (float32, PyTorch Linear layout)."""

    pre_norm: np.ndarray  # [d]
    gate: np.ndarray  # [inter, d]
    up: np.ndarray  # [inter, d]
    down: np.ndarray  # [d, inter]
    embed_scale: float
    eps: float
    source: object = None  # what the weights were taken from (callers tell a stale setup by it)


@dataclass(frozen=True, eq=False)
class HeadSetup:
    """How a context's head is configured. `soft_top_k` 0: the soft embedding over the whole
    vocabulary (a transposed copy of token_embd on the device, f16 when `embd_t_f16`)."""

    self_conditioning: SelfConditioningWeights | None = None
    n_slots: int = 0
    soft_top_k: int = 0
    embd_t_f16: bool = False


@dataclass(frozen=True)
class HeadRequest:
    """The head's inputs for one decode, one entry per requested output row (in output order)."""

    inv_temp: np.ndarray  # float32: 1 / temperature (1 for greedy rows)
    uniform: np.ndarray  # float32 in [0, 1): the draw of each row
    top_k: int = 0
    top_p: float = 1.0
    margin: bool = False
    bias_row: np.ndarray | None = None  # int32: row of the bias table per output row
    sc_write: np.ndarray | None = None  # int32: self-conditioning slot each row writes (None: no signal)
    sc_read: np.ndarray | None = None  # int32 per batch token: the slot its decoder input reads (0: none)
    keep_logits: bool = False  # also return the logits: (RowStats, logits) (tests compare with the host)


class LlamaModel:
    """A loaded GGUF model. Validates the header before llama.cpp sees the file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int | None = None,
        progress: Callable[[float], bool] | None = None,
        header: GgufHeader | None = None,
    ) -> None:
        self.path = Path(path)
        self.header = header if header is not None else read_gguf_header(self.path)
        # llama.cpp GGML_ASSERTs (aborts the process) on some out-of-range values: none reach it
        from dgchat.model_backend.model_check import check_model_header

        check_model_header(self.header)
        params = _llama.llama_model_default_params()
        # layers go to local GPUs and registered RPC servers (model_backend/rpc.py); llama.cpp
        # puts the RPC servers first and splits the layers by each device's free memory
        from dgchat.model_backend import rpc

        remote = rpc.registered()
        gpu = local_gpu_present()
        if n_gpu_layers is None:
            n_gpu_layers = 999 if (gpu or remote) else 0
        params.n_gpu_layers = n_gpu_layers
        params.use_extra_bufts = use_extra_buffer_types()
        if remote and n_gpu_layers > 0 and not _rpc_in_use():
            rpc.check_before_load()  # llama.cpp aborts the process on a server that went away
        self._progress_cb = None
        if progress is not None:

            def _cb(fraction: float, _user: ctypes.c_void_p) -> bool:
                try:
                    return bool(progress(float(fraction)))
                except Exception:  # a UI callback must never crash the loader
                    return True

            self._progress_cb = _llama.llama_progress_callback(_cb)
            params.progress_callback = self._progress_cb
        self._ptr = _llama.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._ptr:
            reason = _last_error_line() or "llama.cpp could not load it"
            raise ModelFileError(f"{self.path.name}: {reason}")
        self._holds_rpc = bool(remote and n_gpu_layers > 0)
        if self._holds_rpc:
            global _rpc_models_alive
            with _rpc_lock:
                _rpc_models_alive += 1
        self._vocab_ptr = _llama.llama_model_get_vocab(self._ptr)
        self.n_vocab = int(_llama.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(_llama.llama_model_n_embd(self._ptr))
        self.n_layer = int(_llama.llama_model_n_layer(self._ptr))
        self.n_ctx_train = int(_llama.llama_model_n_ctx_train(self._ptr))
        self.n_swa = int(_llama.llama_model_n_swa(self._ptr))
        self.n_gpu_layers = n_gpu_layers
        # llama.cpp offloads the output layer (the LM head) once every repeating layer is offloaded
        # (to the last device: an RPC server's may be a CPU, so only a local GPU counts here)
        self.output_on_gpu = gpu and n_gpu_layers > self.n_layer
        self.is_diffusion_arch = bool(_llama.llama_model_is_diffusion(self._ptr))
        self._named: frozenset[int] | None = None  # bos, eos, ... ids (is_special)

    @property
    def _vocab(self) -> ctypes.c_void_p:
        """The vocabulary lives inside the model: after close() llama.cpp has freed it, and a call
        through the stale pointer would crash the process, so it is an error instead."""
        if not getattr(self, "_ptr", None):
            raise EngineError("the model was closed: its vocabulary is gone (use the engine inside its `with`)")
        return self._vocab_ptr

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_ptr", None):
            _llama.llama_model_free(self._ptr)
            self._ptr = None
            if getattr(self, "_holds_rpc", False):
                global _rpc_models_alive
                with _rpc_lock:
                    _rpc_models_alive -= 1
                self._holds_rpc = False

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata -----------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.header.architecture or "?"

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _llama.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def size_bytes(self) -> int:
        return int(_llama.llama_model_size(self._ptr))

    # -- vocabulary ---------------------------------------------------------------------------
    def _special(self, fn: Callable[[object], int]) -> int | None:
        tok = int(fn(self._vocab))
        return None if tok < 0 else tok

    @property
    def bos(self) -> int | None:
        return self._special(_llama.llama_vocab_bos)

    @property
    def eos(self) -> int | None:
        return self._special(_llama.llama_vocab_eos)

    @property
    def eot(self) -> int | None:
        return self._special(_llama.llama_vocab_eot)

    @property
    def mask(self) -> int | None:
        return self._special(_llama.llama_vocab_mask)

    @property
    def pad(self) -> int | None:
        return self._special(_llama.llama_vocab_pad)

    @property
    def add_bos(self) -> bool:
        return bool(_llama.llama_vocab_get_add_bos(self._vocab))

    def is_eog(self, token: int) -> bool:
        return bool(_llama.llama_vocab_is_eog(self._vocab, int(token)))

    def eog_ids(self) -> np.ndarray:
        """Every end-of-generation token id (eos, eot, and the ones llama.cpp derives)."""
        return np.array([t for t in range(self.n_vocab) if self.is_eog(t)], dtype=np.int32)

    def is_control(self, token: int) -> bool:
        return bool(_llama.llama_vocab_is_control(self._vocab, int(token)))

    def parsed_as_special(self, token: int) -> bool:
        """Whether tokenizing with parse_special=True is what produces this token from its text
        (control and unknown tokens; user-defined ones are matched either way)."""
        if not 0 <= int(token) < self.n_vocab:
            return False
        attr = int(_llama.llama_vocab_get_attr(self._vocab, int(token)))
        return bool(attr & (_llama.LLAMA_TOKEN_ATTR_CONTROL | _llama.LLAMA_TOKEN_ATTR_UNKNOWN))

    def is_special(self, token: int) -> bool:
        """Whether a token's text is markup, not answer text: control and unknown tokens (the ones
        llama.cpp's detokenizer leaves out of an answer) and the ids the vocabulary names (bos,
        eos, eot, pad, mask: a file may forget to mark these as control). Ids outside the
        vocabulary count as special (they have no text)."""
        if not 0 <= int(token) < self.n_vocab:
            return True
        if int(token) in self._named_ids():
            return True
        attr = int(_llama.llama_vocab_get_attr(self._vocab, int(token)))
        return bool(attr & (_llama.LLAMA_TOKEN_ATTR_CONTROL | _llama.LLAMA_TOKEN_ATTR_UNKNOWN))

    def _named_ids(self) -> frozenset[int]:
        named = self._named
        if named is None:
            fns = (_llama.llama_vocab_bos, _llama.llama_vocab_eos, _llama.llama_vocab_eot, _llama.llama_vocab_pad,
                   _llama.llama_vocab_mask)
            named = self._named = frozenset(t for t in (self._special(fn) for fn in fns) if t is not None)
        return named

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        raw = text.encode("utf-8")
        n_max = len(raw) + 8
        buf = (_llama.llama_token * n_max)()
        n = _llama.llama_tokenize(self._vocab, raw, len(raw), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (_llama.llama_token * n_max)()
            n = _llama.llama_tokenize(self._vocab, raw, len(raw), buf, n_max, add_special, parse_special)
            if n < 0:
                raise EngineError("tokenization failed")
        return np.ctypeslib.as_array(buf)[:n].astype(np.int32)

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = _llama.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _llama.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def detokenize(
        self, tokens: Sequence[int] | np.ndarray, *, remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        if arr.size == 0:
            return ""
        ptr = arr.ctypes.data_as(ctypes.POINTER(_llama.llama_token))
        cap = max(64, arr.size * 16)
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = _llama.llama_detokenize(self._vocab, ptr, arr.size, buf, cap, remove_special, unparse_special)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = -n + 1
        raise EngineError("detokenization failed")

    def embedding_matrix(self) -> np.ndarray:
        """token_embd.weight as float32 (n_vocab, n_embd), read from the file (dequantized)."""
        from dgchat.model_backend.gguf_file import read_tensor

        return read_tensor(self.header, "token_embd.weight")


class _Batch:
    """A llama_batch whose arrays are owned by numpy, so filling it is vectorised and copy-free."""

    def __init__(self, capacity: int, n_embd: int, n_seq_max: int) -> None:
        self.capacity = capacity
        self.n_embd = n_embd
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32) if n_embd else None
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros((capacity, n_seq_max), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        row_ptrs = self.seq_ids.ctypes.data + np.arange(capacity, dtype=np.uint64) * self.seq_ids.strides[0]
        self._seq_ptrs = (ctypes.POINTER(_llama.llama_seq_id) * capacity)(
            *[ctypes.cast(int(p), ctypes.POINTER(_llama.llama_seq_id)) for p in row_ptrs]
        )
        self.struct = _llama.llama_batch()
        if self.embd is None:
            self.struct.token = self.tokens.ctypes.data_as(ctypes.POINTER(_llama.llama_token))
        else:
            self.struct.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(_llama.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self._seq_ptrs
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))


OutputSpec = slice | np.ndarray | Sequence[int] | None


def _libc_strlen():
    try:
        libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        return libc.strlen
    except (OSError, AttributeError):
        return None


_STRLEN = _libc_strlen()


class AbortFlag:
    """A cancel flag that llama.cpp polls between graph nodes without entering Python.

    ggml calls the abort callback after every node; a Python callback costs a GIL round trip each
    time (measured: ~25 ms added to a 7 ms decode of 32 tokens on 2 threads). Instead the callback is
    libc's strlen on a two-byte buffer: "\\0" has length 0 (false: keep going), "\\1" length 1
    (true: abort); the byte after it stays 0, so the length never exceeds 1. Without a usable libc
    the flag falls back to a Python callback."""

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)
        self._event = threading.Event()
        self._py_cb = None

    def callback(self):
        """(callback, data) for llama_context_params."""
        if _STRLEN is not None:
            fn = ctypes.cast(_STRLEN, _llama.ggml_abort_callback)
            return fn, ctypes.cast(self._buf, ctypes.c_void_p)
        self._py_cb = _llama.ggml_abort_callback(lambda _data: self._event.is_set())
        return self._py_cb, None

    def set(self) -> None:
        self._event.set()
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._event.clear()
        self._buf[0] = b"\x00"

    def is_set(self) -> bool:
        return self._event.is_set()


class LlamaContext:
    """An inference context. `max_tokens` bounds one decode call (and the ubatch: non-causal
    attention needs the whole batch in one ubatch)."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        n_ctx: int,
        max_tokens: int,
        n_seq_max: int = 1,
        n_threads: int | None = None,
        swa_full: bool = True,
        exact_kv: bool = False,
        per_seq_ctx: int | None = None,
    ) -> None:
        per_seq = per_seq_ctx or n_ctx
        if per_seq > model.n_ctx_train > 0:
            raise ContextOverflowError(
                f"{per_seq} tokens needed but {model.path.name} supports at most {model.n_ctx_train}"
            )
        # every context is made here (engine, machine profile, distillation): the thread bound of
        # model_backend.params holds for all of them (100000 threads segfaulted in llama.cpp)
        check_threads(n_threads or None, "threads")
        self.model = model
        params = _llama.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = max_tokens
        params.n_ubatch = max_tokens
        params.n_seq_max = n_seq_max
        threads = n_threads or max(1, os.cpu_count() or 1)
        params.n_threads = threads
        params.n_threads_batch = threads
        params.swa_full = swa_full
        # one KV buffer for all sequences: llama.cpp then keeps a batch of several sequences in one
        # ubatch (split_simple); per-sequence buffers split it into equal-length pieces, which
        # would cut a sequence's non-causal attention apart
        params.kv_unified = True
        params.no_perf = True
        if exact_kv:
            # f32 K/V and no flash attention: slower, but logits can be compared with a reference
            # implementation to ~1e-5 instead of the ~1e-3 that an f16 cache allows.
            params.type_k = _llama.GGML_TYPE_F32
            params.type_v = _llama.GGML_TYPE_F32
            params.flash_attn_type = _llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self._cancel = AbortFlag()
        params.abort_callback, params.abort_callback_data = self._cancel.callback()
        self._ptr = _llama.llama_init_from_model(model._ptr, params)
        if not self._ptr:
            raise EngineError(f"could not create a context of {n_ctx} tokens: {_last_error_line() or 'out of memory?'}")
        self.n_ctx = int(_llama.llama_n_ctx(self._ptr))
        self.max_tokens = max_tokens
        self.n_seq_max = n_seq_max
        self._mem = _llama.llama_get_memory(self._ptr)
        # whether llama.cpp returns only the requested rows of logits (always with KV memory)
        self._rows_on_request = bool(self._mem) or engine_info().encode_outputs
        self._token_batch = _Batch(max_tokens, 0, n_seq_max)
        self._embd_batch: _Batch | None = None
        self._causal = True
        self.n_decodes = 0
        self._head_setup: HeadSetup | None = None
        self._head_bias_key: bytes | None = None
        self._head_bias_table: np.ndarray | None = None

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_ptr", None):
            _llama.llama_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()

    # -- state --------------------------------------------------------------------------------
    @property
    def has_memory(self) -> bool:
        """False for llada/dream/rnd1 GGUFs: every call re-runs the whole batch (no KV cache)."""
        return bool(self._mem)

    def set_causal(self, causal: bool) -> None:
        if causal != self._causal:
            _llama.llama_set_causal_attn(self._ptr, causal)
            self._causal = causal

    @property
    def cancel_event(self) -> AbortFlag:
        """Set it to abort the decode in flight; the decode raises GenerationCancelled."""
        return self._cancel

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> None:
        if self._mem and not _llama.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
            raise EngineError(f"could not remove KV cells [{p0}, {p1}) of sequence {seq_id}")

    def seq_pos_max(self, seq_id: int = 0) -> int:
        """Largest position cached for the sequence, -1 when empty or without memory."""
        if not self._mem:
            return -1
        return int(_llama.llama_memory_seq_pos_max(self._mem, seq_id))

    def clear(self) -> None:
        if self._mem:
            _llama.llama_memory_clear(self._mem, True)

    # -- the diffusion head ---------------------------------------------------------------------
    def configure_head(self, setup: HeadSetup) -> None:
        """(Re)configure the head; a no-op when `setup` is the object already configured."""
        if _HEAD is None:
            raise EngineError("this llama-cpp-python has no dgchat head (install with README's command)")
        if setup is self._head_setup:
            return
        p = _HeadParams()
        sc = setup.self_conditioning
        keep: list[np.ndarray] = []
        if sc is not None:
            arrays = [np.ascontiguousarray(a, dtype=np.float32) for a in (sc.pre_norm, sc.gate, sc.up, sc.down)]
            keep.extend(arrays)
            p.self_cond = True
            p.n_slots = int(setup.n_slots)
            p.soft_top_k = int(setup.soft_top_k)
            p.embd_t_type = _GGML_TYPES["f16" if setup.embd_t_f16 else "f32"]
            p.embed_scale = float(sc.embed_scale)
            p.eps = float(sc.eps)
            p.n_inter = int(arrays[1].shape[0])
            p.w_type = _GGML_TYPES["f32"]
            p.pre_norm, p.gate, p.up, p.down = (a.ctypes.data for a in arrays)
        self._head_setup = None
        self._head_bias_key = self._head_bias_table = None
        if _HEAD["init"](self._ptr, ctypes.byref(p)) != 0:
            raise EngineError(f"could not set up the diffusion head: {_last_error_line() or 'llama.cpp refused it'}")
        self._head_setup = setup

    def set_head_bias(self, table: np.ndarray | None) -> None:
        """The additive logit bias rows the head's requests index (`bias_row`); None: no bias.
        Uploaded only when it changed (the same array object is taken as unchanged)."""
        if table is self._head_bias_table:
            return
        self._head_bias_table = table
        table = None if table is None or table.size == 0 else np.ascontiguousarray(table, dtype=np.float32)
        key = b"" if table is None else table.tobytes()
        if key == self._head_bias_key:
            return
        n = 0 if table is None else table.shape[0]
        if table is not None and table.shape[1] != self.model.n_vocab:
            raise EngineError(f"bias rows have {table.shape[1]} entries, the vocabulary {self.model.n_vocab}")
        if _HEAD["set_bias"](self._ptr, _ptr(table), n) != 0:
            raise EngineError(f"could not set the logit bias: {_last_error_line()}")
        self._head_bias_key = key

    # -- decoding -----------------------------------------------------------------------------
    def decode_tokens(
        self,
        tokens: np.ndarray | Sequence[int],
        positions: np.ndarray | Sequence[int],
        *,
        seq_ids: np.ndarray | Sequence[int] | int = 0,
        outputs: OutputSpec = None,
        head: HeadRequest | None = None,
    ) -> np.ndarray | RowStats:
        """Logits of the requested outputs, or with `head` the head's statistics of them (the
        context must have a configured head)."""
        tok = np.asarray(tokens, dtype=np.int32)
        batch = self._token_batch
        n = self._check_size(tok.shape[0])
        batch.tokens[:n] = tok
        return self._run(batch, n, positions, seq_ids, outputs, head)

    def decode_embeddings(
        self,
        embeddings: np.ndarray,
        positions: np.ndarray | Sequence[int],
        *,
        seq_ids: np.ndarray | Sequence[int] | int = 0,
        outputs: OutputSpec = None,
    ) -> np.ndarray:
        if self._embd_batch is None:
            self._embd_batch = _Batch(self.max_tokens, self.model.n_embd, self.n_seq_max)
        batch = self._embd_batch
        n = self._check_size(embeddings.shape[0])
        if embeddings.shape[1] != self.model.n_embd:
            raise EngineError(f"embedding width {embeddings.shape[1]} != model width {self.model.n_embd}")
        batch.embd[:n] = embeddings
        return self._run(batch, n, positions, seq_ids, outputs)

    def _check_size(self, n: int) -> int:
        if n == 0:
            raise EngineError("empty batch")
        if n > self.max_tokens:
            raise ContextOverflowError(f"a batch of {n} tokens exceeds this context's limit of {self.max_tokens}")
        return n

    def _run(self, batch: _Batch, n: int, positions, seq_ids, outputs: OutputSpec,
             head: HeadRequest | None = None) -> np.ndarray | RowStats:
        batch.pos[:n] = np.asarray(positions, dtype=np.int32)
        batch.seq_ids[:n, 0] = seq_ids
        batch.logits[:n] = 0
        if outputs is None:
            out_idx = np.arange(n)
        elif isinstance(outputs, slice):
            out_idx = np.arange(n)[outputs]
        else:
            out_idx = np.asarray(outputs)
            if out_idx.dtype == np.bool_:
                out_idx = np.flatnonzero(out_idx[:n])
            else:
                # llama.cpp returns rows in batch order, so requests are sorted and deduplicated
                out_idx = np.unique(out_idx.astype(np.int64))
        batch.logits[out_idx] = 1
        batch.struct.n_tokens = n
        if head is not None:
            self._prepare_head(head, n, out_idx)
        rc = _llama.llama_decode(self._ptr, batch.struct)
        self.n_decodes += 1
        if rc == 2 or (rc != 0 and self._cancel.is_set()):
            self._cancel.clear()
            raise GenerationCancelled("generation cancelled")
        if rc == 1:
            raise ContextOverflowError(f"no room in the KV cache for {n} more tokens (context {self.n_ctx})")
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc}: {_last_error_line()}")
        if head is not None:
            stats = self._head_results(int(out_idx.size))
            return (stats, self._logits_rows(n, out_idx)) if head.keep_logits else stats
        return self._logits_rows(n, out_idx)

    def _prepare_head(self, head: HeadRequest, n_tokens: int, out_idx: np.ndarray) -> None:
        if self._head_setup is None:
            raise EngineError("the diffusion head is not configured on this context")
        rows_n = int(out_idx.size)
        arrays = {
            "inv_temp": np.ascontiguousarray(head.inv_temp, dtype=np.float32),
            "uniform": np.ascontiguousarray(head.uniform, dtype=np.float32),
            "bias_row": None if head.bias_row is None else np.ascontiguousarray(head.bias_row, dtype=np.int32),
            "sc_write": None if head.sc_write is None else np.ascontiguousarray(head.sc_write, dtype=np.int32),
            "sc_read": None if head.sc_read is None else np.ascontiguousarray(head.sc_read, dtype=np.int32),
        }
        for name in ("inv_temp", "uniform", "bias_row", "sc_write"):
            a = arrays[name]
            if a is not None and a.shape != (rows_n,):
                raise EngineError(f"head input {name} has shape {a.shape}, expected ({rows_n},)")
        if arrays["sc_read"] is not None and arrays["sc_read"].shape != (n_tokens,):
            raise EngineError(f"head input sc_read has shape {arrays['sc_read'].shape}, expected ({n_tokens},)")
        b = _HeadBatch(top_k=int(head.top_k), top_p=float(head.top_p), margin=bool(head.margin), n_rows=rows_n,
                       n_tokens=n_tokens, keep_logits=bool(head.keep_logits))
        for name, a in arrays.items():
            setattr(b, name, _ptr(a))
        if _HEAD["prepare"](self._ptr, ctypes.byref(b)) != 0:
            raise EngineError(f"diffusion head: {_last_error_line() or 'bad inputs'}")

    def read_head_signal(self, slots: np.ndarray) -> np.ndarray:
        """The self-conditioning signals the head holds in `slots` ([n, n_embd]; for tests)."""
        idx = np.ascontiguousarray(slots, dtype=np.int32)
        out = np.empty((idx.size, self.model.n_embd), dtype=np.float32)
        if _HEAD["read_slots"](self._ptr, _ptr(idx), idx.size, _ptr(out)) != 0:
            raise EngineError(f"could not read the head's signal: {_last_error_line()}")
        return out

    def _head_results(self, n_rows: int) -> RowStats:
        got = ctypes.c_int32(0)
        ptr = _HEAD["results"](self._ptr, ctypes.byref(got))
        if not ptr or got.value != n_rows:
            raise EngineError(f"the diffusion head returned {got.value} rows, expected {n_rows}: {_last_error_line()}")
        # one array per result: drawn and argmax int32, then entropy, p_drawn, p_argmax, p_second float32
        raw = np.frombuffer((ctypes.c_char * (HEAD_RESULTS * n_rows * 4)).from_address(ptr), dtype=np.uint8).copy()
        ints = raw[: 2 * n_rows * 4].view(np.int32)
        floats = raw[2 * n_rows * 4 :].view(np.float32).reshape(4, n_rows)
        return RowStats(drawn=ints[:n_rows], argmax=ints[n_rows:], entropy=floats[0], p_drawn=floats[1],
                        p_argmax=floats[2], p_second=floats[3])

    def _logits_rows(self, n: int, out_idx: np.ndarray) -> np.ndarray:
        """Rows of llama.cpp's logits buffer for the requested outputs, in request order.

        llama.cpp returns only the flagged rows, except that a stock engine runs models without
        memory (llada, dream) through encode(), which outputs every position. Either way the result
        is a view when the requested rows are contiguous."""
        n_vocab = self.model.n_vocab
        if self._rows_on_request and out_idx.size == 0:
            return np.empty((0, n_vocab), dtype=np.float32)
        ptr = _llama.llama_get_logits(self._ptr)
        if not ptr:
            raise EngineError("llama.cpp returned no logits")
        n_rows = out_idx.size if self._rows_on_request else n
        addr = ctypes.addressof(ptr.contents)
        buf = (ctypes.c_float * (n_rows * n_vocab)).from_address(addr)
        rows = np.frombuffer(buf, dtype=np.float32).reshape(n_rows, n_vocab)
        if self._rows_on_request:
            return rows
        if out_idx.size and np.all(np.diff(out_idx) == 1):
            return rows[out_idx[0] : out_idx[-1] + 1]
        return rows[out_idx]


# -- llama.cpp's sampler chain, as examples/diffusion uses it (reference mode) --------------------
# The example samples each masked position by filling a llama_token_data array with the position's
# logits (the whole vocabulary), applying a chain of top-k, top-p, temperature and dist(seed), and
# reading the candidates the chain leaves behind (calculate_confidence). Calling that chain here
# reproduces the example by construction: the same partial sorts, the same float/double arithmetic
# and the same std::mt19937 stream. The arrays the chain works on are numpy structured arrays (and
# so are the llama_token_data_array headers pointing at them): a row is filled by two vectorised
# copies (logits, and token ids when a sorting stage scrambled them), the headers are reset and the
# results read back for many rows at once, and the per-row Python work is the copy and the call.

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
_ARRAY_HEADER = np.dtype(  # llama_token_data_array: data, size, selected, sorted (C layout)
    [("data", np.uintp), ("size", np.uintp), ("selected", np.int64), ("sorted", np.bool_)], align=True
)
LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp seeds dist from the clock for this value, not reproducibly
_ENTROPY_EPS = np.float32(1e-10)  # calculate_confidence: p * logf(p + 1e-10)
_CHUNK_BYTES = 8 << 20  # rows per buffer (results are read back a buffer at a time); fits an L3 cache
_ROWS_PER_THREAD = 16  # fewer rows per thread than this are not worth a thread
_MAX_THREADS = 8  # each thread holds a buffer of _CHUNK_BYTES; the GIL-held part of a row caps the gain


def _sampler_api_ok() -> bool:
    names = ("llama_sampler_chain_init", "llama_sampler_chain_default_params", "llama_sampler_chain_add",
             "llama_sampler_init_top_k", "llama_sampler_init_top_p", "llama_sampler_init_temp",
             "llama_sampler_init_dist", "llama_sampler_apply", "llama_sampler_clone", "llama_sampler_free")
    if not all(hasattr(_llama, n) for n in names):
        return False
    td, ta = _llama.llama_token_data, _llama.llama_token_data_array
    return (ctypes.sizeof(td) == TOKEN_DATA.itemsize and ctypes.sizeof(ta) == _ARRAY_HEADER.itemsize
            and all(getattr(ta, f).offset == _ARRAY_HEADER.fields[f][1] for f in _ARRAY_HEADER.names))


SAMPLER_CHAIN = _sampler_api_ok()


@dataclass(frozen=True)
class ChainDraws:
    """Per sampled row, what calculate_confidence in examples/diffusion reads from the candidates."""

    tokens: np.ndarray  # int32: the selected candidate's token id
    p_selected: np.ndarray  # float32: its probability (confidence, origin)
    p_first: np.ndarray  # float32: candidate 0's probability (margin)
    p_second: np.ndarray  # float32: candidate 1's probability, 0 when one candidate is left (margin)
    n_candidates: np.ndarray  # int64: candidates left after top-k / top-p
    entropy: np.ndarray | None  # float32: -sum p * logf(p + 1e-10) over the candidates, when asked


class _RowBuffers:
    """One thread's rows: `capacity` llama_token_data arrays of the whole vocabulary, and one
    llama_token_data_array header per row, both owned by numpy."""

    def __init__(self, n_vocab: int, capacity: int) -> None:
        self.capacity = capacity
        self.cand = np.zeros((capacity, n_vocab), dtype=TOKEN_DATA)
        self.cand["id"] = np.arange(n_vocab, dtype=np.int32)
        self.ids, self.logits, self.probs = self.cand["id"], self.cand["logit"], self.cand["p"]
        self.addrs = self.cand.ctypes.data + np.arange(capacity, dtype=np.uintp) * np.uintp(self.cand.strides[0])
        self.headers = np.zeros(capacity, dtype=_ARRAY_HEADER)
        base = self.headers.ctypes.data
        self._structs = [_llama.llama_token_data_array.from_address(base + i * _ARRAY_HEADER.itemsize)
                         for i in range(capacity)]
        self.refs = [ctypes.byref(s) for s in self._structs]


def _new_chain(top_k: int, top_p: float, temperature: float, seed: int):
    # the order and the conditions of examples/diffusion's chain; top-p keeps at least one token
    chain = _llama.llama_sampler_chain_init(_llama.llama_sampler_chain_default_params())
    if top_k > 0:
        _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_top_k(int(top_k)))
    if top_p < 1.0:
        _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_top_p(float(top_p), 1))
    if temperature > 0.0:
        _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_temp(float(temperature)))
    _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))
    return chain


class SamplerChain:
    """llama.cpp's sampler chain built as examples/diffusion builds it, applied to many rows of logits.

    `sample` applies the chain to the given rows in order, exactly as the example's loop over masked
    positions would (the dist sampler's random stream advances once per row). With `threads` > 1 the
    rows are split into contiguous parts sampled concurrently (llama_sampler_apply runs without the
    GIL): each part gets a clone of the chain whose dist stream is advanced to the part's first row,
    so the draws are the ones a single chain makes. Close it (or use it as a context manager) to
    free the samplers."""

    def __init__(self, n_vocab: int, *, top_k: int, top_p: float, temperature: float, seed: int) -> None:
        if not SAMPLER_CHAIN:
            raise EngineError("this llama-cpp-python has no usable llama_sampler API")
        self.n_vocab = int(n_vocab)
        self._chain = _new_chain(top_k, top_p, temperature, seed)
        # top-k and top-p sort the candidates in place, scrambling the ids; temperature and dist
        # leave them where they are, so without a sorting stage the ids are written once
        self._sorts = top_k > 0 or top_p < 1.0
        self._id_row = np.arange(self.n_vocab, dtype=np.int32)
        self._rows_per_chunk = max(1, _CHUNK_BYTES // (self.n_vocab * TOKEN_DATA.itemsize))
        self._buffers: list[_RowBuffers] = []
        self._pool = None
        self._one = np.zeros(1, dtype=TOKEN_DATA)  # a single candidate: advances dist by one draw
        self._one_header = _llama.llama_token_data_array(
            ctypes.cast(self._one.ctypes.data, _llama.llama_token_data_p), 1, -1, False)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_chain", None):
            _llama.llama_sampler_free(self._chain)
            self._chain = None
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sampling -------------------------------------------------------------------------------
    def sample(self, logits: np.ndarray, rows: np.ndarray, *, entropy: bool = False, threads: int = 1) -> ChainDraws:
        """Apply the chain to `logits[rows[i]]` for i in order; `logits` is (n, n_vocab) float32."""
        if self._chain is None:
            raise EngineError("the sampler chain is closed")
        if logits.ndim != 2 or logits.shape[1] != self.n_vocab or logits.dtype != np.float32:
            raise EngineError(f"logits of shape {logits.shape} ({logits.dtype}); expected (n, {self.n_vocab}) float32")
        rows = np.ascontiguousarray(rows, dtype=np.intp)
        n = int(rows.size)
        if n and (rows.min() < 0 or rows.max() >= logits.shape[0]):
            raise EngineError(f"row index out of range for {logits.shape[0]} rows of logits")
        out = ChainDraws(np.empty(n, np.int32), np.empty(n, np.float32), np.empty(n, np.float32),
                         np.empty(n, np.float32), np.empty(n, np.int64), np.empty(n, np.float32) if entropy else None)
        parts = max(1, min(int(threads), _MAX_THREADS, n // _ROWS_PER_THREAD))
        while len(self._buffers) < parts:
            self._buffers.append(_RowBuffers(self.n_vocab, self._rows_per_chunk))
        if parts == 1:
            self._sample_part(self._chain, self._buffers[0], logits, rows, 0, n, out)
            return out
        from concurrent.futures import ThreadPoolExecutor, wait

        bounds = [n * i // parts for i in range(parts + 1)]
        chains, jobs = [self._chain], []
        try:
            for lo in bounds[1:-1]:
                clone = _llama.llama_sampler_clone(self._chain)
                chains.append(clone)
                self._advance(clone, lo)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=_MAX_THREADS - 1, thread_name_prefix="llama-sampler")
            jobs = [self._pool.submit(self._sample_part, chains[i], self._buffers[i], logits, rows, bounds[i],
                                      bounds[i + 1], out) for i in range(1, parts)]
            self._sample_part(chains[0], self._buffers[0], logits, rows, bounds[0], bounds[1], out)
            for job in jobs:
                job.result()
        except BaseException:
            wait(jobs)  # no clone is freed while a thread may still be applying it
            for c in chains[1:]:
                _llama.llama_sampler_free(c)
            raise
        # the last part's chain has drawn for every row before it and its own: it carries on
        for c in chains[:-1]:
            _llama.llama_sampler_free(c)
        self._chain = chains[-1]
        return out

    def skip(self, n_rows: int) -> None:
        """Advance the chain as `sample` on `n_rows` rows would, without sampling them (for rows
        whose tokens would be thrown away: only the random stream's position matters)."""
        if self._chain is None:
            raise EngineError("the sampler chain is closed")
        self._advance(self._chain, int(n_rows))

    def _advance(self, chain, n_draws: int) -> None:
        """Advance `chain`'s dist stream by `n_draws` rows: dist draws once even for one candidate."""
        header, ref = self._one_header, ctypes.byref(self._one_header)
        for _ in range(n_draws):
            header.size, header.selected, header.sorted = 1, -1, False
            _llama.llama_sampler_apply(chain, ref)

    def _sample_part(self, chain, buf: _RowBuffers, logits: np.ndarray, rows: np.ndarray, lo: int, hi: int,
                     out: ChainDraws) -> None:
        apply = _llama.llama_sampler_apply
        sorts, id_row = self._sorts, self._id_row
        for a in range(lo, hi, buf.capacity):
            m = min(buf.capacity, hi - a)
            h = buf.headers[:m]
            h["data"], h["size"], h["selected"], h["sorted"] = buf.addrs[:m], self.n_vocab, -1, False
            # fill and apply row by row, so each row is still in the core's cache when the chain reads it
            for j, row in enumerate(rows[a:a + m].tolist()):
                buf.logits[j] = logits[row]
                if sorts:
                    buf.ids[j] = id_row
                apply(chain, buf.refs[j])
            moved = np.flatnonzero(h["data"] != buf.addrs[:m])
            for j in moved:  # a sampler may point `data` elsewhere (none of these four do today)
                src = (ctypes.c_char * (int(h["size"][j]) * TOKEN_DATA.itemsize)).from_address(int(h["data"][j]))
                buf.cand[j, : int(h["size"][j])] = np.frombuffer(src, dtype=TOKEN_DATA)
            self._read(buf, h, out, a, m)

    @staticmethod
    def _read(buf: _RowBuffers, h: np.ndarray, out: ChainDraws, a: int, m: int) -> None:
        r = np.arange(m)
        sel = h["selected"].astype(np.intp)
        size = h["size"].astype(np.int64)
        probs = buf.probs[:m]
        out.tokens[a:a + m] = buf.ids[r, sel]
        out.p_selected[a:a + m] = probs[r, sel]
        out.p_first[a:a + m] = probs[:, 0]
        out.p_second[a:a + m] = np.where(size > 1, probs[:, min(1, probs.shape[1] - 1)], np.float32(0))
        out.n_candidates[a:a + m] = size
        if out.entropy is not None:
            width = int(size.max())
            p = np.where(np.arange(width)[None, :] < size[:, None], probs[:, :width], np.float32(0))
            # logf rounded from double (correctly rounded, as glibc's logf is to within 0.52 ulp);
            # product and running sum in float, in candidate order, as the C loop does
            logs = np.log((p + _ENTROPY_EPS).astype(np.float64)).astype(np.float32)
            terms = (p * logs).astype(np.float32)
            out.entropy[a:a + m] = -np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]


class DistSampler:
    """llama_sampler_init_dist(seed) on its own: examples/diffusion's draw of which positions to
    commit when alg_temp > 0."""

    def __init__(self, seed: int) -> None:
        if not SAMPLER_CHAIN:
            raise EngineError("this llama-cpp-python has no usable llama_sampler API")
        self._smpl = _llama.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF)

    def draw(self, logits: np.ndarray, n: int) -> np.ndarray:
        """Indices of `n` draws from softmax(`logits`), each from the same candidates (the example
        applies dist repeatedly to one array, so an index can come twice)."""
        cand = np.zeros(len(logits), dtype=TOKEN_DATA)
        cand["id"] = np.arange(len(logits), dtype=np.int32)
        cand["logit"] = logits
        header = _llama.llama_token_data_array(ctypes.cast(cand.ctypes.data, _llama.llama_token_data_p),
                                               len(logits), -1, False)
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            _llama.llama_sampler_apply(self._smpl, ctypes.byref(header))
            out[i] = header.selected
            cand["p"][header.selected] = 0.0  # as the example does; dist recomputes every p anyway
            header.selected = -1
        return out

    def close(self) -> None:
        if getattr(self, "_smpl", None):
            _llama.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> DistSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
