"""Which llama.cpp build this is: its version, dgchat's patch level and what that enables, and a key
naming the build on this machine (measurements made with one build are not reused with another)."""

from __future__ import annotations

import ctypes
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from dgchat.model_backend.llamacpp.devices import local_gpu_devices, local_gpu_present
from dgchat.model_backend.llamacpp.head import HEAD
from dgchat.model_backend.llamacpp.library import cpu_uses_amx, system_info
from dgchat.model_backend.llamacpp.library import llama_cpp as _llama


@dataclass(frozen=True)
class EngineInfo:
    """What the loaded llama.cpp build can do; the properties name each feature dgchat's patches add."""

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
        return self.patch_level >= 3 and HEAD is not None

    @property
    def block_causal(self) -> bool:
        """A GGUF's `dgchat.engine.attention_block` makes non-causal attention block-causal
        (engine/patches/0017): what block-diffusion models (SDAR, BD3LM) need."""
        return self.patch_level >= 7

    @property
    def amx_safe(self) -> bool:
        """ggml's AMX weight buffer keeps its tile configuration whatever compiler built the engine
        (engine/patches/0009)."""
        return self.patch_level >= 4


def engine_info() -> EngineInfo:
    """The loaded build's version, GPU offload and dgchat patch level (0 for a stock llama-cpp-python)."""
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


def engine_build_key() -> str:
    """Names this engine build on this machine: a measurement made with one build (its kernels, its
    CPU features, its GPUs) is not reused with another. Built from the llama.cpp library file
    (path, size, modification time), the patch level, llama.cpp's system info and the GPU names."""
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
