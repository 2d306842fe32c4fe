"""`load_engine`: a model file loaded by the engine class of its family.

The engine classes know nothing of each other (DiffusionGemmaEngine and BlockDiffusionEngine extend
DiffusionEngine; the base names neither): this module reads the file's header, asks model_info
which family the model is, and loads it with that family's class. Everything that opens a model
file for generation calls this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dgchat.model_backend import llamacpp
from dgchat.model_backend.block_diffusion import BlockDiffusionEngine
from dgchat.model_backend.diffusion_gemma import DiffusionGemmaEngine
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.model_info import ModelInfo, inspect_header
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import check_threads
from dgchat.model_backend.placement import EXPERTS_ON

# ModelInfo.family -> the class that runs it
ENGINE_CLASSES: dict[str, type[DiffusionEngine]] = {
    DiffusionEngine.family: DiffusionEngine,
    DiffusionGemmaEngine.family: DiffusionGemmaEngine,
    BlockDiffusionEngine.family: BlockDiffusionEngine,
}


def engine_class(info: ModelInfo) -> type[DiffusionEngine]:
    """The engine class that runs a model of this kind."""
    return ENGINE_CLASSES[info.family]


def load_engine(
    path: str | Path,
    *,
    n_gpu_layers: int | None = None,
    n_threads: int | None = None,
    progress: Callable[[float], bool] | None = None,
    precise: bool = False,
    rpc_servers: str | Sequence[str] | None = None,
    experts_on: str = "auto",
) -> DiffusionEngine:
    """Load the model at `path` with its family's engine. An unsupported or broken file is refused
    from its header, before llama.cpp loads anything. rpc_servers: "HOST:PORT[,HOST:PORT]" of
    llama.cpp RPC servers to put layers on (registered for the whole process, as `--rpc` does:
    model_backend/rpc.py); servers registered before are used too. n_gpu_layers (llama.cpp's
    count: the output layer, then the last N-1 layers) and experts_on ("auto", "cpu", "gpu")
    override the placement planned from free GPU memory (model_backend/placement.py)."""
    if experts_on not in EXPERTS_ON:
        raise InvalidParameterError(f"experts_on must be one of {', '.join(EXPERTS_ON)} (got {experts_on!r})")
    check_threads(n_threads, "threads")  # before the model loads (the flags and config are checked earlier)
    header = read_gguf_header(path)
    info = inspect_header(header)  # refuse unsupported models before llama.cpp loads anything
    return engine_class(info).open(path, header, info, n_gpu_layers=n_gpu_layers, n_threads=n_threads,
                                   progress=progress, precise=precise, rpc_servers=rpc_servers, experts_on=experts_on)


def load_model(path: str | Path, *, n_threads: int | None = None) -> llamacpp.LlamaModel:
    """The llama.cpp model at `path`, checked and loaded as `load_engine` loads it, without an engine:
    for code that decodes with a context of its own (convert/default_model/distill.py's batched teacher),
    so that it need not reach into an engine for its model. `n_threads` is checked for that context."""
    check_threads(n_threads, "threads")
    header = read_gguf_header(path)
    inspect_header(header)  # refuse unsupported models before llama.cpp loads anything
    return llamacpp.LlamaModel(path, header=header)
