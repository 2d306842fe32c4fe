"""ggml's device registry: the devices this engine computes on (CPU, local GPUs, RPC servers' devices).

llama-cpp-python no longer wraps the registry, so the few ggml functions needed are bound here, from
ggml's own libraries (libllama links them). llama.cpp's RPC backend registers its servers' devices
in the same registry (llamacpp/rpc_backend.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dgchat.model_backend.errors import EngineError
from dgchat.model_backend.llamacpp.library import llama_cpp as _llama

# llama_cpp's helper that loads a shared library from a folder (absent from some versions)
try:
    from llama_cpp import _ctypes_extensions
except ImportError:
    _ctypes_extensions = None

DEV_CPU, DEV_GPU, DEV_IGPU = 0, 1, 2  # enum ggml_backend_dev_type
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
    # the buffer type llama.cpp's loader compares a tensor override with to keep a tensor in RAM
    # (src/llama-model-loader.cpp: `overrides->buft == ggml_backend_cpu_buffer_type()`); it lives
    # in libggml-base, the same library libllama calls it in
    "ggml_backend_cpu_buffer_type": (ctypes.c_void_p, []),
}
_ggml_fns: dict[str, Callable] | None = None


@dataclass(frozen=True)
class BackendDevice:
    name: str  # e.g. RPC0, CPU, CUDA0
    description: str  # an RPC device's is its server's HOST:PORT
    memory_free: int
    memory_total: int


def ggml_libraries() -> list[ctypes.CDLL]:
    """libllama and ggml's own libraries beside it (ggml's functions live in one of them)."""
    libs = [_llama.llama_cpp._lib]
    # ggml's libraries sit next to the libllama actually loaded: the package's lib/ folder, or the
    # build folder LLAMA_CPP_LIB_PATH names (the GPU checks). Binding another folder's libggml
    # would list that build's devices, not the ones llama.cpp offloads to.
    loaded = getattr(_llama.llama_cpp._lib, "_name", "") or ""
    lib_dir = Path(loaded).resolve().parent if loaded else Path(_llama.__file__).resolve().parent / "lib"
    if _ctypes_extensions is not None:
        for name in ("ggml", "ggml-base"):
            try:
                libs.append(_ctypes_extensions.load_shared_library(name, lib_dir))
            except (OSError, RuntimeError, FileNotFoundError):
                pass
    return libs


def ggml() -> dict[str, Callable]:
    """ggml's registry functions, bound once (they live in libggml / libggml-base)."""
    global _ggml_fns
    if _ggml_fns is None:
        _llama.llama_supports_gpu_offload()  # loads dynamic backends first, as llama.cpp does
        libs = ggml_libraries()
        fns: dict[str, Callable] = {}
        for name, (restype, argtypes) in _GGML_SIGNATURES.items():
            fn = next((f for lib in libs if (f := getattr(lib, name, None)) is not None), None)
            if fn is None:
                raise EngineError(f"this engine's ggml does not export {name}")
            fn.restype, fn.argtypes = restype, argtypes
            fns[name] = fn
        _ggml_fns = fns
    return _ggml_fns


def is_rpc_device(dev: int) -> bool:
    """Whether a registry device belongs to llama.cpp's RPC backend (a remote server's)."""
    g = ggml()
    name = g["ggml_backend_reg_name"](g["ggml_backend_dev_backend_reg"](dev)) or b""
    return name.startswith(b"RPC")


def device_info(dev: int) -> BackendDevice:
    """A registry device's name, description and memory (an RPC device asks its server)."""
    g = ggml()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    g["ggml_backend_dev_memory"](dev, ctypes.byref(free), ctypes.byref(total))
    return BackendDevice(name=(g["ggml_backend_dev_name"](dev) or b"?").decode("utf-8", "replace"),
                         description=(g["ggml_backend_dev_description"](dev) or b"").decode("utf-8", "replace"),
                         memory_free=int(free.value), memory_total=int(total.value))


def local_gpu_present() -> bool:
    """A GPU on this machine llama.cpp can offload to. An RPC build's `llama_supports_gpu_offload()`
    says yes on any machine (it counts the RPC backend), so devices are counted here instead."""
    if not _llama.llama_supports_gpu_offload():
        return False
    try:
        g = ggml()
    except EngineError:
        return True  # no registry to ask: trust llama.cpp
    for i in range(g["ggml_backend_dev_count"]()):
        dev = g["ggml_backend_dev_get"](i)
        if g["ggml_backend_dev_type"](dev) in (DEV_GPU, DEV_IGPU) and not is_rpc_device(dev):
            return True
    return False


def local_gpu_devices() -> list[BackendDevice]:
    """The local GPUs this engine can offload to (none for a CPU-only build; RPC devices excluded)."""
    if not _llama.llama_supports_gpu_offload():
        return []
    try:
        g = ggml()
    except EngineError:
        return []
    devs = (g["ggml_backend_dev_get"](i) for i in range(g["ggml_backend_dev_count"]()))
    return [device_info(d) for d in devs
            if g["ggml_backend_dev_type"](d) in (DEV_GPU, DEV_IGPU) and not is_rpc_device(d)]


def cpu_buffer_type() -> int:
    """ggml's CPU buffer type (a pointer): a tensor override to it keeps the tensor in RAM."""
    buft = ggml()["ggml_backend_cpu_buffer_type"]()
    if not buft:
        raise EngineError("this engine's ggml has no CPU buffer type")
    return int(buft)
