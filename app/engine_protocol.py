"""`Engine`: what the app uses of a loaded model, as a Protocol.

model_backend.engine.DiffusionEngine is the real one; tests wrap it (to hold a generation at a
step). Typing screens and widgets with this instead of `Any` says which calls the UI relies on.

`ServedEngine` is an optional capability on top: what a server's model (dgchat.remote.RemoteEngine)
adds. Screens ask `served(engine)` instead of probing attributes one by one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from dgchat.model_backend.events import FinalEvent, StepEvent
    from dgchat.model_backend.model_info import ModelInfo
    from dgchat.model_backend.params import DiffusionParams


class Engine(Protocol):
    """What the app uses of a loaded model (model_backend.engine.DiffusionEngine; tests wrap it)."""

    info: ModelInfo
    model: Any  # the llama.cpp model (vocabulary, end tokens) for the tools' token bookkeeping

    @property
    def label(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def n_ctx_max(self) -> int: ...
    def resolve(self, params: DiffusionParams | None = None) -> DiffusionParams: ...
    def chat_prompt(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True) -> np.ndarray: ...
    def encode(self, text: str, *, special: bool = False) -> np.ndarray: ...
    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None: ...
    def generate(self, prompt_tokens: np.ndarray, params: DiffusionParams | None = None, *,
                 cancel: threading.Event | None = None, template: Any = None) -> Iterator[StepEvent | FinalEvent]: ...
    def piece(self, token: int) -> str: ...
    def detokenize(self, tokens: np.ndarray | Sequence[int]) -> str: ...
    def is_end(self, token: int) -> bool: ...
    def is_special(self, token: int) -> bool: ...  # markup, never drawn as text (cheap: cached per token)
    def close(self) -> None: ...


@runtime_checkable
class ServedEngine(Protocol):
    """What an engine on an OpenAI-compatible server adds to `Engine` (dgchat.remote.RemoteEngine, or
    a test's wrapper around one). A local engine has none of these."""

    server_model: Any  # dgchat.remote.wire.ServerModel: the server's /v1/models entry
    is_dgchat: bool  # a `dgchat serve` server: live canvas, diffusion settings, /v1/infill

    @property
    def url(self) -> str: ...
    @property
    def model_id(self) -> str: ...
    def unsupported(self, params: DiffusionParams) -> list[str]: ...  # settings this server cannot take
    def infill(self, body: dict[str, Any]) -> dict[str, Any]: ...  # POST /v1/infill (dgchat serve only)


def served(engine: object) -> ServedEngine | None:
    """`engine` as a server's model, or None for a local one (or no engine)."""
    return engine if engine is not None and isinstance(engine, ServedEngine) else None
