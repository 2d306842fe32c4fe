"""The placement of one model load: model_backend/placement.py's plan for this machine's devices.

`decide_placement` reads the local GPUs' free memory from ggml's device registry (or the limit
$DGCHAT_GPU_MEMORY states), sizes the weights from the GGUF header, and plans. `tensor_overrides`
turns a plan's patterns into llama.cpp's NULL-terminated `llama_model_tensor_buft_override` array.
"""

from __future__ import annotations

import ctypes
import os

from dgchat.model_backend import rpc_probe
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.gguf_file import GgufHeader
from dgchat.model_backend.llamacpp.devices import cpu_buffer_type, local_gpu_devices, local_gpu_present
from dgchat.model_backend.placement import (
    ModelBytes,
    Placement,
    parse_bytes,
    plan_placement,
    runtime_from_header,
)

GPU_MEMORY_ENV = "DGCHAT_GPU_MEMORY"
# The context a plan reserves KV cache for: the engine sizes its context to the prompt and canvas
# when it generates (engine.context_for), so the load cannot know it; 8192 tokens is what the
# catalog's fit estimate assumes too. A longer conversation grows the cache past the plan (the
# margin absorbs some of it).
PLAN_CONTEXT = 8192
ALL_LAYERS = 999  # n_gpu_layers for "everything", as before plans existed (RPC servers)


class TensorOverride(ctypes.Structure):
    """include/llama.h's `struct llama_model_tensor_buft_override {const char *pattern;
    ggml_backend_buffer_type_t buft;}`. llama-cpp-python's `llama_model_tensor_override` declares
    the second field an int, not the pointer it is, so it is declared here."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def tensor_overrides(patterns: list[str]) -> tuple[ctypes.Array, list[bytes]] | None:
    """The override array for `patterns` (each kept in RAM), ended by a NULL pattern, and the
    pattern bytes it points into: the caller keeps both alive as long as the model (llama.cpp reads
    them during the load). None for no patterns."""
    if not patterns:
        return None
    raw = [p.encode() for p in patterns]
    buft = cpu_buffer_type()
    array = (TensorOverride * (len(raw) + 1))()
    for slot, pattern in zip(array, raw):
        slot.pattern, slot.buft = pattern, buft
    return array, raw  # the last slot stays zeroed: the terminator


def gpu_memory_limit() -> int | None:
    """$DGCHAT_GPU_MEMORY ("12G", "2048M"): the device memory a plan may use, None when unset."""
    text = os.environ.get(GPU_MEMORY_ENV, "").strip()
    if not text:
        return None
    try:
        return parse_bytes(text)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"${GPU_MEMORY_ENV}: {exc}") from None


def gpu_free_memory(limit: int | None = None) -> int:
    """Free memory of the local GPUs together (llama.cpp splits layers between them by free
    memory), capped by `limit` (default: $DGCHAT_GPU_MEMORY's); 0 without a local GPU."""
    if limit is None:
        limit = gpu_memory_limit()  # read first: a bad value is an error on any machine
    if not local_gpu_present():
        return 0
    free = sum(d.memory_free for d in local_gpu_devices())
    if limit is not None:
        return min(free, limit) if free > 0 else limit
    return free


def decide_placement(header: GgufHeader, *, gpu_layers: int | None = None, experts_on: str = "auto",
                     canvas: int = 256, n_ctx: int = PLAN_CONTEXT, kv_bytes_per_value: int = 2,
                     kv_cache: bool = True) -> Placement:
    """The placement to load `header`'s model with on this machine. With RPC servers registered,
    today's behaviour stays: every layer offloaded (or `gpu_layers`), llama.cpp splits them between
    the servers and local GPUs by free memory, no plan."""
    model = ModelBytes.from_header(header)
    if rpc_probe.registered():
        n = ALL_LAYERS if gpu_layers is None else gpu_layers
        return Placement("gpu" if n > 0 else "cpu", n, (), 0, 0, 0,
                         "RPC servers: llama.cpp splits the layers by each device's free memory (no plan)",
                         model.n_layer)
    runtime = runtime_from_header(header, n_ctx=n_ctx, canvas=canvas, kv_bytes_per_value=kv_bytes_per_value,
                                  kv_cache=kv_cache)
    # a stated limit ($DGCHAT_GPU_MEMORY) is what the plan may use: no margin kept off it; the
    # driver-reported free memory keeps one (the driver's and other programs' allocations)
    limit = gpu_memory_limit()
    return plan_placement(model, gpu_free=gpu_free_memory(limit), runtime=runtime, gpu_layers=gpu_layers,
                          experts_on=experts_on, **({"margin": 0.0, "reserve": 0} if limit is not None else {}))
