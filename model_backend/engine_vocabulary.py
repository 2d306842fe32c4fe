"""EngineVocabulary: a local engine's tokenizer and vocabulary, the text half of DiffusionEngine.

Chat templates to token ids, text to tokens and back, one token's text, and what the vocabulary
says of a token (an end, markup, a control token): the part of engine_protocol.Engine that callers
use instead of reaching into `engine.model`. A mixin rather than a composed object because these are
the engine's own methods on the protocol (the app, the server and the NPC generator call them on the
engine) and the engine's subclasses widen what they read (DiffusionGemmaEngine adds end ids to
`_eog` after construction, which `is_end` reads on first use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dgchat.model_backend import llamacpp, prompt_tokens
from dgchat.model_backend.chat_template import CHATML, render_chat
from dgchat.model_backend.model_info import ModelInfo

Message = dict[str, Any]


class EngineVocabulary:
    """The tokenizer and vocabulary methods of model_backend.engine.DiffusionEngine, on its llama.cpp
    `model`, its `info` and its end-of-generation ids `_eog`; `_init_vocabulary` makes the caches."""

    model: llamacpp.LlamaModel
    info: ModelInfo
    _eog: np.ndarray  # the end ids generation stops at; `is_end` counts these

    def _init_vocabulary(self) -> None:
        """The per-token caches, empty (called by the engine's __init__)."""
        self._pieces: dict[int, str] = {}
        self._special_attr: dict[int, bool] = {}
        self._special: dict[int, bool] = {}  # is_special, per token as asked (no vocabulary scan)
        self._ends: frozenset[int] | None = None  # is_end (built on first use: subclasses add end ids)
        self._control: tuple[int, ...] | None = None  # control_tokens (a vocabulary scan, once)

    # -- text ---------------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> np.ndarray:
        """The conversation through the model's chat template, as token ids.

        Only the template's own markers become control tokens: text in the messages that spells a
        control token (`<|im_end|>`, `<end_of_turn>`) stays plain text (model_backend/prompt_tokens)."""
        template = self.info.chat_template or CHATML
        bos = self.model.token_piece(self.model.bos).decode("utf-8", "replace") if self.model.bos is not None else ""
        eos = self.model.token_piece(self.model.eos).decode("utf-8", "replace") if self.model.eos is not None else ""
        render = lambda msgs: render_chat(template, msgs, add_generation_prompt=add_generation_prompt,  # noqa: E731
                                          bos_token=bos, eos_token=eos)
        text = render(prompt_tokens.guard_messages(list(messages)))
        tokens = prompt_tokens.tokenize_guarded(text, self._tokenize, self._parsed_as_special)
        if tokens is None:  # the template cut a message's marker off: defuse the text instead
            defused = prompt_tokens.defuse_messages(list(messages), self._tokenize, self._parsed_as_special, self.piece)
            tokens = self._tokenize(render(defused), True)
        return self._with_bos(tokens)

    def encode(self, text: str, *, special: bool = False) -> np.ndarray:
        """Tokenize `text`; a BOS is added once (templates often write it).

        special=False (the default): control-token text stays plain text, as for anything a person
        wrote. special=True is the explicit opt-in for raw prompts whose author writes the markers
        (`dgchat generate --raw`)."""
        return self._with_bos(self._tokenize(text, special))

    def tokenize(self, text: str, *, special: bool = False) -> np.ndarray:
        """Tokenize `text` as it stands: no BOS added (`encode` adds one). special: as for `encode`."""
        return self._tokenize(text, special)

    def _tokenize(self, text: str, special: bool) -> np.ndarray:
        return self.model.tokenize(text, add_special=False, parse_special=special)

    def _parsed_as_special(self, token: int) -> bool:
        cached = self._special_attr.get(token)
        if cached is None:
            cached = self._special_attr[token] = self.model.parsed_as_special(token)
        return cached

    def _with_bos(self, tokens: np.ndarray) -> np.ndarray:
        bos = self.model.bos
        if self.model.add_bos and bos is not None and (tokens.size == 0 or tokens[0] != bos):
            tokens = np.concatenate([np.array([bos], dtype=np.int32), tokens])
        return tokens.astype(np.int32, copy=False)

    def piece(self, token: int) -> str:
        """Display text of one token (special tokens rendered), cached."""
        text = self._pieces.get(token)
        if text is None:
            text = self.model.token_piece(token, special=True).decode("utf-8", errors="replace")
            self._pieces[token] = text
        return text

    def detokenize(self, tokens: np.ndarray | Sequence[int]) -> str:
        return self.model.detokenize(tokens, remove_special=False, unparse_special=False)

    def is_end(self, token: int) -> bool:
        """Whether `token` ends an answer (eos, end of turn, and the other end-of-generation ids)."""
        ends = self._ends
        if ends is None:
            ends = self._ends = frozenset(int(t) for t in self._eog)
        return int(token) in ends

    def is_special(self, token: int) -> bool:
        """Whether `token` is markup, never answer text: pad, bos, mask, end tokens, anything the
        vocabulary marks control. The live canvas draws none of them as text. Cached per token:
        the canvas asks about every position up to 30 times a second."""
        cached = self._special.get(token)
        if cached is None:
            cached = self._special[int(token)] = (
                self.is_end(token) or int(token) == self.info.mask_token or self.model.is_special(token))
        return cached

    # -- the vocabulary (engine_protocol.Engine: what callers need instead of `engine.model`) ---
    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    def eog_ids(self) -> np.ndarray:
        """The vocabulary's end-of-generation ids (eos, eot, and the ones llama.cpp derives). `is_end`
        also counts the end ids an engine subclass reads from the model's own metadata."""
        return self.model.eog_ids()

    @property
    def eos(self) -> int | None:
        return self.model.eos

    @property
    def end_token(self) -> int | None:
        """The token that closes a turn: the vocabulary's end of turn, else its eos."""
        eot = self.model.eot
        return eot if eot is not None else self.model.eos

    @property
    def added_bos(self) -> int | None:
        """The BOS that `encode` and `chat_prompt` put first; None for a model that adds none."""
        return self.model.bos if self.model.add_bos else None

    def token_bytes(self, token: int) -> bytes:
        """A token's text as it appears in an answer: UTF-8 bytes (maybe part of a character), b""
        for control tokens."""
        return self.model.token_piece(int(token), special=False)

    def control_tokens(self) -> tuple[int, ...]:
        """The vocabulary's control tokens (turn markers, BOS, ...) other than its end tokens: what a
        canvas that continues into given text must never draw. Scans the vocabulary once."""
        if self._control is None:
            model = self.model
            eog = set(int(t) for t in model.eog_ids())
            self._control = tuple(t for t in range(model.n_vocab) if t not in eog and model.is_control(t))
        return self._control
