"""What a RemoteEngine knows of its server's vocabulary, and its text methods.

A server keeps its tokenizer: prompts go out as messages or text (`RemotePrompt`, an empty token
array that carries them), and token ids come back only with the pieces the server shows
(`ShownTokens`, bounded). `RemoteVocabulary` is the text and vocabulary part of the Engine protocol
(model_backend/engine_protocol.py) answered from what was shown: a mixin of remote.engine.RemoteEngine,
whose methods they are, as DiffusionEngine's are engine_vocabulary.EngineVocabulary's. The module
docstring of remote/engine.py says what a server cannot give and what the app does instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.remote import limits
from dgchat.remote.errors import RemoteApiError


class RemotePrompt(np.ndarray):
    """What `chat_prompt()`/`encode()` return for a remote engine: no tokens (the server has the
    tokenizer), the messages or text to send instead."""

    messages: list[dict[str, Any]] | None
    text: str | None
    suffix: str | None  # completions only: the text after the answer (dgchat serve fills in between)

    def __new__(cls, messages: Sequence[dict[str, Any]] | None = None, text: str | None = None,
                suffix: str | None = None) -> RemotePrompt:
        obj = np.zeros(0, dtype=np.int32).view(cls)
        obj.messages = [dict(m) for m in messages] if messages is not None else None
        obj.text = text
        obj.suffix = suffix
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.messages = getattr(obj, "messages", None)
        self.text = getattr(obj, "text", None)
        self.suffix = getattr(obj, "suffix", None)

    def same_input(self, other: RemotePrompt) -> bool:
        return self.messages == other.messages and self.text == other.text and self.suffix == other.suffix


class ShownTokens:
    """What a server has told of its vocabulary: its size and end tokens, and the pieces (and
    special tokens) it has shown so far (see the module docstring). What it keeps is bounded
    (limits.MAX_PIECES tokens, limits.MAX_PIECE_TOTAL_CHARS characters): a server that shows ever
    new token ids fails (RemoteApiError) instead of filling the memory."""

    def __init__(self, n_vocab: int, end_tokens: Sequence[int], *, url: str = "") -> None:
        self.n_vocab = n_vocab
        self.url = url
        self.ends = np.array(sorted(set(int(t) for t in end_tokens)), dtype=np.int32)
        self.end_set = frozenset(int(t) for t in self.ends)
        self.pieces: dict[int, str] = {}
        self.special: set[int] = set(int(t) for t in end_tokens)
        self._chars = 0

    @property
    def vocab_limit(self) -> int:
        """Token ids a server may show are below this."""
        return self.n_vocab or limits.MAX_VOCAB

    def remember(self, tokens: Sequence[int], texts: Sequence[str | None], special: Sequence[int] = ()) -> None:
        """Pieces (and special tokens) a server has shown; call with the engine's lock held."""
        pieces = self.pieces
        for t, text in zip(tokens, texts):
            if text is None:
                continue
            old = pieces.get(t)
            if old is None and len(pieces) >= limits.MAX_PIECES:
                raise RemoteApiError(f"{self.url} showed more than {limits.MAX_PIECES} distinct tokens; stopped "
                                     "reading (a vocabulary is smaller)", url=self.url, status=502)
            self._chars += len(text) - (len(old) if old is not None else 0)
            if self._chars > limits.MAX_PIECE_TOTAL_CHARS:
                raise RemoteApiError(f"{self.url} showed more than {limits.MAX_PIECE_TOTAL_CHARS} characters of "
                                     "token text; stopped reading", url=self.url, status=502)
            pieces[t] = text
        if special:
            self.special.update(special)
            if len(self.special) > limits.MAX_PIECES:
                raise RemoteApiError(f"{self.url} marked more than {limits.MAX_PIECES} tokens special; stopped "
                                     "reading", url=self.url, status=502)


class RemoteVocabulary:
    """The text and vocabulary methods of remote.engine.RemoteEngine, answered from `shown`: what
    its server has told of the vocabulary (see the module docstring of remote/engine.py)."""

    shown: ShownTokens

    # -- text -----------------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True) -> RemotePrompt:
        # add_generation_prompt=False is a context count's question: unknown remotely either way
        return RemotePrompt(messages=messages)

    def encode(self, text: str, *, special: bool = False) -> RemotePrompt:
        if special:
            raise InvalidParameterError("a raw prompt with control tokens (--raw) needs the model's tokenizer; "
                                        "it is not available over --server")
        return RemotePrompt(text=text)

    def piece(self, token: int) -> str:
        return self.shown.pieces.get(int(token), "")

    def detokenize(self, tokens: np.ndarray | Sequence[int]) -> str:
        pieces = self.shown.pieces
        special = self.shown.special
        return "".join(pieces.get(int(t), "") for t in tokens if int(t) not in special)

    def is_end(self, token: int) -> bool:
        return int(token) in self.shown.end_set

    def is_special(self, token: int) -> bool:
        return int(token) in self.shown.special

    # -- the vocabulary, as far as the server told it (engine_protocol.Engine) ------------------
    @property
    def n_vocab(self) -> int:
        """The server's vocabulary size (dgchat serve says it; 0 for other servers)."""
        return self.shown.n_vocab

    def eog_ids(self) -> np.ndarray:
        return self.shown.ends.copy()

    @property
    def eos(self) -> int | None:
        """The lowest end token the server named (it does not say which one is eos)."""
        ends = self.shown.ends
        return int(ends[0]) if ends.size else None

    @property
    def end_token(self) -> int | None:
        return self.eos  # no end-of-turn id on the wire

    @property
    def added_bos(self) -> int | None:
        return None  # the server adds what its model adds

    def tokenize(self, text: str, *, special: bool = False) -> np.ndarray:
        raise InvalidParameterError("counting or spelling tokens needs the model's tokenizer; it is not "
                                    "available over --server")

    def token_bytes(self, token: int) -> bytes:
        if self.is_special(token):
            return b""
        return self.shown.pieces.get(int(token), "").encode("utf-8")

    def control_tokens(self) -> tuple[int, ...]:
        """The special tokens shown so far, other than end tokens (grows as the server shows more)."""
        shown = self.shown
        return tuple(sorted(t for t in shown.special if 0 <= t < shown.n_vocab and t not in shown.end_set))
