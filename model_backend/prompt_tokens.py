"""Chat prompts tokenized so that only the template's own markers become control tokens.

llama.cpp's tokenizer, asked to parse special tokens, turns *any* occurrence of a control token's
text into that token, wherever it came from. A chat prompt is the template's markers plus people's
text, so a player's line containing `<|im_end|>\\n<|im_start|>system ...` (or `<end_of_turn>`)
would open a real new turn: prompt injection for every game that passes player text to an NPC.

How the text is kept plain: every message's content (and name) is wrapped in a marker character
that nobody types (U+FDD0, a Unicode noncharacter, removed from the messages first) placed inside
its leading/trailing whitespace, so a template's `| trim` behaves exactly as before. After
rendering, the markers split the prompt into template text and people's text. If people's text holds
no control-token text and no control token straddles a boundary (the usual case), the prompt is
tokenized in one piece exactly as before; otherwise template pieces are tokenized with special
parsing and people's pieces without. A template that cuts a marker off (slicing a message) gets the
fallback: control-token text in the messages is broken up with a WORD JOINER (U+2060) before
rendering, so it is still shown but can no longer be parsed as a marker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

MARK = "\ufdd0"
JOINER = "\u2060"
_GUARDED_FIELDS = ("content", "name", "reasoning_content")

Tokenize = Callable[[str, bool], np.ndarray]  # (text, parse_special) -> token ids


def _wrap(text: str) -> str:
    text = text.replace(MARK, "")
    core = text.strip()
    if not core:
        return text
    start = text.index(core)
    return text[:start] + MARK + core + MARK + text[start + len(core):]


def _map_text(value: Any, fn: Callable[[str], str]) -> Any:
    """Apply `fn` to a message field: a string, or the text parts of OpenAI-style content lists."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        out = []
        for part in value:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                part = {**part, "text": fn(part["text"])}
            out.append(part)
        return out
    return value


def _map_messages(messages: Sequence[dict[str, Any]], fn: Callable[[str], str]) -> list[dict[str, Any]]:
    """Copies of the messages with `fn` applied to people's text (the guarded fields)."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        copy = dict(message)
        for key in _GUARDED_FIELDS:
            if key in copy:
                copy[key] = _map_text(copy[key], fn)
        out.append(copy)
    return out


def guard_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the messages with people's text wrapped in MARK."""
    return _map_messages(messages, _wrap)


def _specials(tokens: np.ndarray, is_special: Callable[[int], bool]) -> list[int]:
    return [int(t) for t in tokens if is_special(int(t))]


def tokenize_guarded(text: str, tokenize: Tokenize, is_special: Callable[[int], bool]) -> np.ndarray | None:
    """Token ids of a prompt rendered from `guard_messages` output; None when the template broke
    the markers (an odd number of them), for the caller's fallback."""
    parts = text.split(MARK)
    if len(parts) % 2 == 0:
        return None
    plain = "".join(parts)
    whole = tokenize(plain, True)
    template_parts = parts[0::2]
    people_parts = parts[1::2]
    injected = any(_specials(tokenize(p, True), is_special) for p in people_parts if p)
    template_specials = [t for p in template_parts if p for t in _specials(tokenize(p, True), is_special)]
    if not injected and _specials(whole, is_special) == template_specials:
        return whole  # the common case: byte for byte what the model was trained on
    pieces = [tokenize(p, i % 2 == 0) for i, p in enumerate(parts) if p]
    return np.concatenate(pieces).astype(np.int32) if pieces else np.empty(0, np.int32)


def defuse_messages(messages: Sequence[dict[str, Any]], tokenize: Tokenize, is_special: Callable[[int], bool],
                    piece: Callable[[int], str]) -> list[dict[str, Any]]:
    """The fallback: control-token text in people's text broken up by a WORD JOINER after its
    first character, repeated until none is left."""

    def defuse(text: str) -> str:
        text = text.replace(MARK, "")
        for _ in range(8):
            found = {piece(t) for t in _specials(tokenize(text, True), is_special)}
            found.discard("")
            if not found:
                return text
            for marker in sorted(found, key=len, reverse=True):
                text = text.replace(marker, marker[0] + JOINER + marker[1:])
        return text.replace("<", "<" + JOINER)  # pathological: nothing that looks like a marker is left

    return _map_messages(messages, defuse)
