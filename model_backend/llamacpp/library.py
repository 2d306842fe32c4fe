"""Loading llama.cpp: the shared library, its log, and what the build says about itself.

Every other module of this package imports `llama_cpp` from here, so the set-up below (OpenMP's
wait policy before libgomp loads, the log callback, `llama_backend_init`) runs once, first.
llama.cpp's own log lines are captured in a ring buffer; they reach stderr only when verbose.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Callable

from dgchat.model_backend.errors import EngineError

# ggml's CPU backend parallelises with OpenMP and meets a barrier after every graph node. libgomp's
# default waits there by spinning for a long time: a thread that loses its core to another process
# (the UI thread, a build) stalls every barrier (a 2-thread decode: 820 ms instead of 140 on a loaded
# 2-core machine). Passive waiting (sleeping at once) costs a wake-up per node instead: 56 ms against
# 52 on an idle machine. A short bounded spin is the best of both, measured idle, with one core busy
# and with both busy (52 / 91 / 110-125 ms). Must be set before libgomp loads; the user's values win
# (GOMP_SPINCOUNT only counts while OMP_WAIT_POLICY is unset).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "2000")


def _promote_libstdcxx() -> None:
    """Put the C++ runtime into the process's global symbol scope before llama.cpp loads.

    A C++ program has libstdc++ in its global scope, so every library binds libstdc++'s own
    definitions; Python does not, and ctypes loads libllama with RTLD_LOCAL, so its references go to
    the first library in its own search list that defines them. Seen on an H200 (CUDA 13.0, GCC 13
    host compiler, the patched engine): that build's libggml-cuda carried copies of libstdc++ code,
    and every model load of a process that had imported numpy first died in
    llama_model::print_info, running libggml-cuda's copy of std::ostream::_M_insert<long> into
    codecvt<char16_t>::do_unshift; with dgchat's engine imported first the same load passed. Why
    that build has the copies was not established (a GCC 12 host build here has none). With
    libstdc++ global, every library binds the one runtime. Harmless without a GPU build."""
    if not sys.platform.startswith("linux"):
        return  # Mach-O two-level namespaces and PE imports bind per library
    try:  # the soname every libstdc++ since GCC 3.4 has; an already loaded copy is promoted, not reloaded
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass  # a static or missing libstdc++: then nothing can bind to a second copy either


_promote_libstdcxx()

try:
    import llama_cpp as _llama
except (ImportError, OSError) as exc:  # a missing or broken shared library
    raise EngineError(f"llama-cpp-python could not be loaded: {exc}") from exc

llama_cpp = _llama  # the loaded module, for this package's other modules (imported from here, after the set-up)

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


def last_error_line() -> str:
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


def set_log_hook(hook: Callable[[str], None] | None) -> None:
    """Also pass every chunk llama.cpp logs to `hook` (None: stop); exceptions from it are ignored."""
    _log_state["hook"] = hook


def system_info() -> str:
    """llama.cpp's one-line summary of the CPU features and backends it was built for."""
    return (_llama.llama_print_system_info() or b"").decode(errors="replace").strip()


def cpu_uses_amx() -> bool:
    """Whether this engine's CPU backend would place weights in ggml's AMX buffer (built for, and
    running on, a CPU with AMX-INT8: Intel Sapphire Rapids and later)."""
    info = (_llama.llama_print_system_info() or b"").decode(errors="replace")
    return re.search(r"\bAMX_INT8 = 1\b", info) is not None


def set_blas_threads(n: int) -> bool:
    """Threads numpy's BLAS may use from now on (process-wide). False when it cannot be set.

    The samplers' matrix products are small next to a decode (DiffusionGemma's self-conditioning
    on the bundled model: ~0.2 GFLOP a step). A multi-threaded BLAS call is gated by its slowest
    thread, so when another process holds a core it waits a whole time slice: on the 2-core dev
    machine with one core busy, 2 BLAS threads made the bundled model's sampler 229 ms a step
    against 7.6 ms with 1 (and slowed the next llama.cpp decode, 18.6 -> 12.2 ms)."""
    try:
        # not at module level: only DiffusionGemma's sampler needs it, and it costs ~13 ms at start-up
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=max(1, int(n)), user_api="blas")
    return True


