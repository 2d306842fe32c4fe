"""llama.cpp's RPC backend (in the default engine build; not with `engine/build.py --no-rpc`).

llama-cpp-python no longer wraps RPC (`rpc_servers` is gone): its functions are reached the way
llama.cpp's common/arg.cpp does, as the "RPC" backend's proc addresses in ggml's registry. Here:
registering a server (`rpc_register_server`; model_backend/rpc.py checks it from Python first),
serving this machine's devices (`run_rpc_server`), and turning ggml's aborts (the RPC client's
answer to a server that went away) into one line and an exit status (`explain_engine_aborts`).
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Callable

from dgchat.model_backend.errors import EngineError
from dgchat.model_backend.llamacpp.devices import (
    DEV_CPU,
    DEV_GPU,
    DEV_IGPU,
    BackendDevice,
    device_info,
    ggml,
    ggml_libraries,
    is_rpc_device,
)
from dgchat.model_backend.llamacpp.library import recent_log

RPC_MISSING = "this engine was built without RPC: python engine/build.py (without --no-rpc)"
_RPC_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_RPC_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_void_p))
_RPC_SET_TIMEOUTS = ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_double)
_rpc_lock = threading.Lock()
_rpc_models_alive = 0  # models loaded while RPC servers were registered (each holds its connections)


def rpc_proc(name: str) -> int | None:
    """The RPC backend's function `name`, or None in an engine built without RPC."""
    try:
        g = ggml()
    except EngineError:
        return None
    reg = g["ggml_backend_reg_by_name"](b"RPC")
    if not reg:
        return None
    return g["ggml_backend_reg_get_proc_address"](reg, name.encode()) or None


def rpc_supported() -> bool:
    """The engine was built with llama.cpp's RPC backend (the default engine build)."""
    return rpc_proc("ggml_backend_rpc_add_server") is not None


def require_rpc() -> None:
    if not rpc_supported():
        raise EngineError(RPC_MISSING)


def rpc_register_server(endpoint: str) -> list[BackendDevice]:
    """Register an RPC server's devices with llama.cpp, as `--rpc` does (ggml_backend_rpc_add_server,
    then ggml_backend_register): every model loaded from now on may place layers on them.

    llama.cpp aborts the process when the server cannot be reached: model_backend/rpc.py greets the
    server first (call `rpc.connect`, not this)."""
    add = rpc_proc("ggml_backend_rpc_add_server")
    if add is None:
        raise EngineError(RPC_MISSING)
    g = ggml()
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
    return [device_info(g["ggml_backend_reg_dev_get"](reg, i)) for i in range(g["ggml_backend_reg_dev_count"](reg))]


def rpc_devices() -> list[BackendDevice]:
    """The registered RPC servers' devices (each query asks its server for free memory)."""
    try:
        g = ggml()
    except EngineError:
        return []
    devs = (g["ggml_backend_dev_get"](i) for i in range(g["ggml_backend_dev_count"]()))
    return [device_info(d) for d in devs if is_rpc_device(d)]


# -- models holding RPC connections (LlamaModel counts itself in and out) ----------------------------


def rpc_in_use() -> bool:
    """Some loaded model holds connections to the RPC servers (so they were reachable at its load)."""
    with _rpc_lock:
        return _rpc_models_alive > 0


def rpc_model_loaded() -> None:
    """A model that placed layers on the RPC servers was loaded."""
    global _rpc_models_alive
    with _rpc_lock:
        _rpc_models_alive += 1


def rpc_model_closed() -> None:
    """A model counted by `rpc_model_loaded` was freed."""
    global _rpc_models_alive
    with _rpc_lock:
        _rpc_models_alive -= 1


# -- ggml's aborts, explained -------------------------------------------------------------------------

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
        setter = next(f for lib in ggml_libraries() if (f := getattr(lib, "ggml_set_abort_callback", None)))
    except StopIteration:
        return
    setter.restype, setter.argtypes = ctypes.c_void_p, [_ABORT_CALLBACK]
    _abort_note["line"] = line if callable(line) else (lambda detail: f"dgchat: error: {line} (llama.cpp: {detail})")
    _abort_note["code"] = exit_code
    _abort_note["callback"] = _on_ggml_abort
    setter(_on_ggml_abort)


# -- serving this machine's devices (`dgchat rpc-server`) ----------------------------------------------

def set_rpc_server_timeouts(idle_s: float, model_idle_s: float) -> bool:
    """How long `run_rpc_server` waits for a client (engine patch 0012; 0: no limit): `idle_s` before
    its greeting, inside a request and between requests while it holds no memory on the server;
    `model_idle_s` between requests while it holds memory. False: this engine cannot bound them."""
    fn = rpc_proc("ggml_backend_rpc_dgchat_set_server_timeouts")
    if fn is None:
        return False
    _RPC_SET_TIMEOUTS(fn)(float(idle_s), float(model_idle_s))
    return True


def run_rpc_server(endpoint: str, *, n_threads: int, use_gpu: bool = True, cache_dir: str | None = None,
                   started: Callable[[list[BackendDevice]], None] | None = None) -> None:
    """Serve this machine's devices to llama.cpp RPC clients at `endpoint` ("IPv4:PORT"), as
    upstream's rpc-server does: the local GPUs (when `use_gpu` and there are any), else the CPU.
    Blocks until the server fails; returns after llama.cpp printed why (e.g. the port is taken)."""
    start = rpc_proc("ggml_backend_rpc_start_server")
    if start is None:
        raise EngineError(RPC_MISSING)
    g = ggml()
    devs = [g["ggml_backend_dev_get"](i) for i in range(g["ggml_backend_dev_count"]())]
    chosen = [d for d in devs if use_gpu and g["ggml_backend_dev_type"](d) in (DEV_GPU, DEV_IGPU)
              and not is_rpc_device(d)]
    if not chosen:
        cpu = g["ggml_backend_dev_by_type"](DEV_CPU)
        if not cpu:
            raise EngineError("llama.cpp found no CPU device to serve")
        chosen = [cpu]
    if started is not None:
        started([device_info(d) for d in chosen])
    array = (ctypes.c_void_p * len(chosen))(*chosen)
    _RPC_START_SERVER(start)(endpoint.encode(), cache_dir.encode() if cache_dir else None,
                             max(1, n_threads), len(chosen), array)
