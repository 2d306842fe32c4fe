"""`Engine`: what the rest of dgchat uses of a loaded model, as a Protocol.

model_backend.engine.DiffusionEngine (and its DiffusionGemmaEngine) is the real one;
dgchat.remote.RemoteEngine stands in for a model on a server; tests wrap both (to hold a generation
at a step). The app, the server, the NPC generator and the commands type engines with this: it says
which calls they rely on. Nothing outside model_backend reaches into an engine's llama.cpp model:
what they need of its vocabulary (size, end tokens, tokenizer, token text) is here.

`ServedEngine` is an optional capability on top: what a server's model (dgchat.remote.RemoteEngine)
adds: its URL and the served model's id. Screens ask `served(engine)` only where what they show is
the server itself (its URL, the served model's name, the remote drafting plan); what differs in
behaviour is on `Engine`: `resolve` leaves out what a server cannot take and `unsupported` names
it, `counts_tokens` (the tokenizer is here), `text_only` (a server that sends text only: no live
canvas, no infill), and `precise` is None where exact mode is the server's.
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
    from dgchat.model_backend.placement import Placement
    from dgchat.model_backend.requests import CanvasTemplate


class Engine(Protocol):
    """What dgchat uses of a loaded model (model_backend.engine.DiffusionEngine, remote.RemoteEngine)."""

    info: ModelInfo

    @property
    def label(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def n_ctx_max(self) -> int: ...
    @property
    def precise(self) -> bool | None: ...  # exact mode (f32 KV cache, no flash attention); None: a server's choice
    # unset settings filled by the model's rules; settings this engine cannot take (a server's) dropped
    def resolve(self, params: DiffusionParams | None = None) -> DiffusionParams: ...
    def unsupported(self, params: DiffusionParams) -> list[str]: ...  # settings it cannot take ([] for a local one)
    @property
    def counts_tokens(self) -> bool: ...  # has the model's tokenizer: a context count before an answer
    @property
    def text_only(self) -> bool: ...  # samples with its own settings, sends text only: no canvas, no infill
    @property
    def placement(self) -> Placement | None: ...  # where the weights went (GPU, RAM); None: a server's
    def chat_prompt(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True) -> np.ndarray: ...
    def encode(self, text: str, *, special: bool = False) -> np.ndarray: ...
    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None: ...
    def generate(self, prompt_tokens: np.ndarray, params: DiffusionParams | None = None, *,
                 cancel: threading.Event | None = None,
                 template: CanvasTemplate | None = None) -> Iterator[StepEvent | FinalEvent]: ...
    def generate_batch(self, prompts: Sequence[np.ndarray], params: Sequence[DiffusionParams], *,
                       cancel: threading.Event | None = None,
                       templates: Sequence[CanvasTemplate | None] | None = None,
                       ) -> Iterator[tuple[int, StepEvent | FinalEvent]]: ...
    def piece(self, token: int) -> str: ...
    def detokenize(self, tokens: np.ndarray | Sequence[int]) -> str: ...
    def is_end(self, token: int) -> bool: ...
    def is_special(self, token: int) -> bool: ...  # markup, never drawn as text (cheap: cached per token)
    def close(self) -> None: ...

    # -- the vocabulary, for token bookkeeping (logit biases, infill canvases, text streaming) --
    @property
    def n_vocab(self) -> int: ...  # token ids are below this (0: a server that does not say)
    def eog_ids(self) -> np.ndarray: ...  # the vocabulary's end-of-generation ids (eos, eot, ...)
    @property
    def eos(self) -> int | None: ...  # the vocabulary's eos: also the filler of a uniform-state infill canvas
    @property
    def end_token(self) -> int | None: ...  # the token that closes a turn: end of turn, else eos
    @property
    def added_bos(self) -> int | None: ...  # the BOS `encode`/`chat_prompt` put first, None if the model adds none
    def tokenize(self, text: str, *, special: bool = False) -> np.ndarray: ...  # like encode, without a BOS
    def token_bytes(self, token: int) -> bytes: ...  # a token's answer text (b"" for control tokens)
    def control_tokens(self) -> tuple[int, ...]: ...  # control tokens (turn markers, BOS) other than end tokens


class LocalEngine(Engine, Protocol):
    """An engine whose model runs in this process (DiffusionEngine): what the server and the NPC
    generator need on top of `Engine`, the model's own score of a text, and whether it runs exact."""

    precise: bool  # f32 KV cache, no flash attention (`--precise`)

    def pseudo_log_likelihood(self, context: np.ndarray, answer: np.ndarray, *, groups: int = 4) -> np.ndarray: ...


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
