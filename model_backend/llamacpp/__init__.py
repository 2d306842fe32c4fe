"""The one thin wrapper over llama-cpp-python's low-level API.

This package is the only place in dgchat that imports `llama_cpp` or `ctypes`
(tests/model_backend/test_llamacpp_layout.py checks it). Everything above it works with numpy
arrays and plain Python values. One module per concern, each importable on its own:

- `library`: loads llama.cpp (first, with its OpenMP and log set-up); its log ring buffer
  (`set_verbose`, `recent_log`), `system_info`, numpy's BLAS threads.
- `devices`: ggml's device registry: local GPUs, each device's memory.
- `head`: dgchat's diffusion head (engine/patches/0006): C bindings, `HeadSetup`, `HeadRequest`.
- `build_info`: `engine_info()` (version, patch level, what it enables), `engine_build_key()`.
- `quantize`: `quantize_model`, llama.cpp's quantizer, GGUF in, GGUF out.
- `rpc_backend`: llama.cpp's RPC backend: `rpc_register_server`, `run_rpc_server`, and one-line
  fatal errors (`explain_engine_aborts`); model_backend/rpc.py checks servers before these run.
- `offload`: `decide_placement`, model_backend/placement.py's plan for this machine's GPUs (their
  free memory, $DGCHAT_GPU_MEMORY), and the tensor-override array llama.cpp takes.
- `model`: `LlamaModel`, a loaded GGUF with its vocabulary and metadata.
- `context`: `LlamaContext`, decoding batches into logits (or the head's statistics), `AbortFlag`.
- `sampler_chain`: llama.cpp's sampler chain as examples/diffusion uses it (reference mode).

Callers import the names below from the package (`from dgchat.model_backend import llamacpp`).
A test that replaces a module-level value patches the module that reads it (e.g.
`llamacpp.build_info.engine_info`, which `use_extra_buffer_types` and `engine_build_key` call).
"""

from dgchat.model_backend.llamacpp.build_info import EngineInfo, engine_build_key, engine_info, use_extra_buffer_types
from dgchat.model_backend.llamacpp.context import AbortFlag, LlamaContext, OutputSpec
from dgchat.model_backend.llamacpp.devices import BackendDevice, local_gpu_devices, local_gpu_present
from dgchat.model_backend.llamacpp.head import HEAD_RESULTS, HeadRequest, HeadSetup, SelfConditioningWeights
from dgchat.model_backend.llamacpp.library import (
    cpu_uses_amx,
    recent_log,
    set_blas_threads,
    set_verbose,
    system_info,
)
from dgchat.model_backend.llamacpp.model import LlamaModel
from dgchat.model_backend.llamacpp.offload import GPU_MEMORY_ENV, decide_placement, gpu_free_memory
from dgchat.model_backend.llamacpp.quantize import quantize_model
from dgchat.model_backend.llamacpp.rpc_backend import (
    RPC_MISSING,
    abort_detail,
    explain_engine_aborts,
    require_rpc,
    rpc_devices,
    rpc_register_server,
    rpc_supported,
    run_rpc_server,
    set_rpc_server_timeouts,
)
from dgchat.model_backend.llamacpp.sampler_chain import (
    LLAMA_DEFAULT_SEED,
    SAMPLER_CHAIN,
    TOKEN_DATA,
    ChainDraws,
    DistSampler,
    SamplerChain,
)

__all__ = [
    "AbortFlag", "BackendDevice", "ChainDraws", "DistSampler", "EngineInfo", "GPU_MEMORY_ENV", "HEAD_RESULTS",
    "HeadRequest", "HeadSetup", "LLAMA_DEFAULT_SEED", "LlamaContext", "LlamaModel", "OutputSpec", "RPC_MISSING",
    "SAMPLER_CHAIN", "SamplerChain", "SelfConditioningWeights", "TOKEN_DATA", "abort_detail", "cpu_uses_amx",
    "decide_placement", "engine_build_key", "engine_info", "explain_engine_aborts", "gpu_free_memory",
    "local_gpu_devices", "local_gpu_present", "quantize_model", "recent_log", "require_rpc", "rpc_devices",
    "rpc_register_server", "rpc_supported", "run_rpc_server", "set_blas_threads", "set_rpc_server_timeouts",
    "set_verbose", "system_info", "use_extra_buffer_types",
]
