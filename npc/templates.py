"""Line templates with holes, and how they become a canvas.

Syntax (docs/NPC.md):

    Halt, {player}! None may pass the {___} after dark.

- `{name}`: a slot (a letter, then letters, digits or _), filled from the game's variables (a missing
  variable is an error).
- `{___}`: a hole the model fills in place, in context on both sides; its length in tokens is
  chosen among DEFAULT_HOLE_LENGTHS by the model's own score. `{___:4}` fixes it at 4 tokens,
  `{___:2-6}` chooses among 2..6 (at most MAX_CANDIDATES evenly spaced values).
  Three or more underscores.
- `{{` and `}}` are literal braces.

On the canvas every run of fixed text is tokenized on its own, so its bytes are exactly the
template's bytes whatever the tokenizer would have merged across a hole boundary, and the output
text is assembled from the fixed strings themselves and the decoded hole tokens: fixed text comes
back byte-identical by construction, and `plan_canvas` checks that the tokens the model sees
spell those same bytes.

Only the joins are normalised (`line_pieces`): a hole's text loses its whitespace on a side where
the fixed text already has some (or where the line starts or ends), and a hole that says nothing
between two spaces leaves one of them, so "The {___} spake" never reads "The  spake" (a hole of
" king", with the leading space many tokenizers put on a word, or an end token that spells
nothing). Fixed text is never changed elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dgchat.model_backend.engine_protocol import Engine
from dgchat.npc.errors import MissingVariableError, TemplateError

DEFAULT_HOLE_LENGTHS = (1, 2, 4, 6)
MAX_HOLE_LENGTH = 64
MAX_CANDIDATES = 6
MAX_HOLES = 16
MAX_TEMPLATE_CHARS = 4000

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_SLOT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")  # a letter first: {__} is a typo, not a slot
_HOLE = re.compile(r"^_{3,}(?::(\d+)(?:-(\d+))?)?$")


@dataclass(frozen=True)
class Hole:
    index: int
    lengths: tuple[int, ...]  # candidate lengths in tokens, ascending; one value = a given length

    @property
    def auto(self) -> bool:
        return len(self.lengths) > 1

    @property
    def default_length(self) -> int:
        return self.lengths[len(self.lengths) // 2]


@dataclass(frozen=True)
class Slot:
    name: str


Part = str | Slot | Hole


@dataclass(frozen=True)
class LineTemplate:
    source: str
    parts: tuple[Part, ...]

    @property
    def holes(self) -> tuple[Hole, ...]:
        return tuple(p for p in self.parts if isinstance(p, Hole))

    @property
    def slots(self) -> tuple[str, ...]:
        seen: list[str] = []
        for p in self.parts:
            if isinstance(p, Slot) and p.name not in seen:
                seen.append(p.name)
        return tuple(seen)

    def fill(self, variables: Mapping[str, object]) -> FilledTemplate:
        """Put the variables into the slots. Values are inserted literally (never parsed again)."""
        missing = [name for name in self.slots if name not in variables]
        if missing:
            raise MissingVariableError(
                f"template {_short(self.source)!r} uses {{{missing[0]}}} but no variable {missing[0]!r} is given"
            )
        parts: list[str | Hole] = []
        for p in self.parts:
            piece: str | Hole = str(variables[p.name]) if isinstance(p, Slot) else p
            if isinstance(piece, str) and parts and isinstance(parts[-1], str):
                parts[-1] += piece
            elif not (isinstance(piece, str) and piece == ""):
                parts.append(piece)
        return FilledTemplate(tuple(parts))


@dataclass(frozen=True)
class FilledTemplate:
    """Fixed strings and holes, in order (adjacent strings merged, empty ones dropped)."""

    parts: tuple[str | Hole, ...]

    @property
    def holes(self) -> tuple[Hole, ...]:
        return tuple(p for p in self.parts if isinstance(p, Hole))

    def display(self, blank: str = "___") -> str:
        """The line with each hole shown as `blank` (what the prompt tells the model)."""
        return "".join(p if isinstance(p, str) else blank for p in self.parts)


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _candidates(lo: int, hi: int) -> tuple[int, ...]:
    if hi - lo + 1 <= MAX_CANDIDATES:
        return tuple(range(lo, hi + 1))
    picks = np.linspace(lo, hi, MAX_CANDIDATES)
    return tuple(sorted({int(round(x)) for x in picks}))


def parse_template(source: str) -> LineTemplate:
    if not isinstance(source, str):
        raise TemplateError(f"a template must be a string (got {type(source).__name__})")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"template is {len(source)} characters; the limit is {MAX_TEMPLATE_CHARS}")
    parts: list[Part] = []
    text: list[str] = []
    pos = 0
    n_holes = 0
    for m in _PLACEHOLDER.finditer(source):
        text.append(source[pos:m.start()])
        pos = m.end()
        token = m.group(0)
        if token in ("{{", "}}"):
            text.append(token[0])
            continue
        if token in ("{", "}"):
            raise TemplateError(
                f"template {_short(source)!r}: unmatched {token!r} at column {m.start() + 1} "
                f"(write {token * 2} for a literal brace)"
            )
        inner = m.group(1).strip()
        if text:
            joined = "".join(text)
            if joined:
                parts.append(joined)
            text = []
        hole = _HOLE.match(inner)
        if hole:
            lo, hi = hole.group(1), hole.group(2)
            if lo is None:
                lengths = DEFAULT_HOLE_LENGTHS
            else:
                a, b = int(lo), int(hi) if hi is not None else int(lo)
                if not 1 <= a <= b <= MAX_HOLE_LENGTH:
                    raise TemplateError(
                        f"template {_short(source)!r}: hole {{{inner}}} needs 1 <= length <= {MAX_HOLE_LENGTH} "
                        "(and low <= high)"
                    )
                lengths = _candidates(a, b)
            parts.append(Hole(n_holes, lengths))
            n_holes += 1
            if n_holes > MAX_HOLES:
                raise TemplateError(f"template {_short(source)!r} has more than {MAX_HOLES} holes")
        elif _SLOT.match(inner):
            parts.append(Slot(inner))
        else:
            raise TemplateError(
                f"template {_short(source)!r}: {{{inner}}} at column {m.start() + 1} is neither a variable "
                "({name}) nor a hole ({___}, {___:4}, {___:2-6})"
            )
    tail = "".join(text) + source[pos:]
    if tail:
        parts.append(tail)
    merged: list[Part] = []
    for p in parts:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return LineTemplate(source, tuple(merged))


# -- the canvas --------------------------------------------------------------------------------

class Tokenizer:
    """What plan_canvas needs from a model: plain-text tokenization (special tokens never parsed:
    a variable holding `<|im_end|>` stays text) and the bytes of a token."""

    def __init__(self, tokenize: Callable[[str], np.ndarray], piece: Callable[[int], bytes]) -> None:
        self._tokenize = tokenize
        self._piece = piece
        self._pieces: dict[int, bytes] = {}
        self._segments: dict[str, np.ndarray] = {}

    @classmethod
    def for_engine(cls, engine: Engine) -> Tokenizer:
        return cls(lambda text: engine.tokenize(text), lambda token: engine.token_bytes(int(token)))

    def piece(self, token: int) -> bytes:
        b = self._pieces.get(token)
        if b is None:
            b = self._piece(token)
            self._pieces[token] = b
        return b

    def bytes_of(self, tokens: Sequence[int] | np.ndarray) -> bytes:
        return b"".join(self.piece(int(t)) for t in tokens)

    def tokenize(self, text: str) -> np.ndarray:
        return np.asarray(self._tokenize(text), dtype=np.int32)

    def segment(self, text: str) -> np.ndarray:
        """Tokens that spell exactly `text`'s UTF-8 bytes, or TemplateError."""
        cached = self._segments.get(text)
        if cached is not None:
            return cached
        tokens = self.tokenize(text)
        want = text.encode("utf-8")
        got = self.bytes_of(tokens)
        if got != want and got == b" " + want and tokens.size and self.piece(int(tokens[0])) == b" ":
            tokens = tokens[1:]  # a SentencePiece dummy prefix that came as a token of its own
            got = self.bytes_of(tokens)
        if got != want:
            raise TemplateError(
                f"this model's tokenizer does not spell the fixed text {_short(text)!r} back byte for byte; "
                "templates cannot keep it fixed"
            )
        self._segments[text] = tokens
        return tokens


@dataclass(frozen=True)
class CanvasPlan:
    """A filled template laid out on a canvas with the holes at given lengths."""

    filled: FilledTemplate
    lengths: tuple[int, ...]  # tokens per hole
    tokens: np.ndarray  # int32, hole positions hold `fill_token`
    fixed: np.ndarray  # bool
    spans: tuple[tuple[int, int], ...]  # [start, end) canvas positions of each hole
    end_token: int | None  # fixed after the line (the end of the turn), not part of the text

    @property
    def hole_tokens(self) -> int:
        return sum(self.lengths)


def plan_canvas(filled: FilledTemplate, lengths: Sequence[int], tokenizer: Tokenizer, *, fill_token: int,
                end_token: int | None = None) -> CanvasPlan:
    holes = filled.holes
    if len(lengths) != len(holes):
        raise ValueError("one length per hole")
    chunks: list[np.ndarray] = []
    fixed: list[np.ndarray] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    for part in filled.parts:
        if isinstance(part, str):
            toks = tokenizer.segment(part)
            chunks.append(toks)
            fixed.append(np.ones(toks.size, dtype=bool))
            pos += toks.size
        else:
            n = int(lengths[part.index])
            chunks.append(np.full(n, fill_token, dtype=np.int32))
            fixed.append(np.zeros(n, dtype=bool))
            spans.append((pos, pos + n))
            pos += n
    if end_token is not None:
        chunks.append(np.array([end_token], dtype=np.int32))
        fixed.append(np.ones(1, dtype=bool))
    tokens = np.concatenate(chunks).astype(np.int32) if chunks else np.empty(0, np.int32)
    return CanvasPlan(filled, tuple(int(x) for x in lengths), tokens, np.concatenate(fixed), tuple(spans), end_token)


_HSPACE = " \t"


def line_pieces(parts: Sequence[str | Hole], hole_texts: Sequence[str]) -> list[tuple[str, int | None]]:
    """The line as (text, hole index or None for fixed text), with the spacing at the joins
    normalised (see the module's docstring): the one assembly of a line, for its text and for
    showing the holes in it."""
    pieces: list[tuple[str, int | None]] = []
    written = ""  # the line so far

    def after_space() -> bool:
        return not written or written[-1].isspace()

    for i, part in enumerate(parts):
        nxt = parts[i + 1] if i + 1 < len(parts) else None
        if isinstance(part, str):
            text = part
            if i > 0 and isinstance(parts[i - 1], Hole) and (not written or written[-1] in _HSPACE):
                text = text.lstrip(_HSPACE)  # the hole before said nothing: one space, not two
            pieces.append((text, None))
        else:
            text = hole_texts[part.index]
            if after_space():
                text = text.lstrip()
            if nxt is None or (isinstance(nxt, str) and nxt[:1].isspace()):
                text = text.rstrip()
            pieces.append((text, part.index))
        written += pieces[-1][0]
    if parts and isinstance(parts[-1], Hole) and not pieces[-1][0]:
        # the line ends in a hole that said nothing: no trailing space before it either
        for k in range(len(pieces) - 2, -1, -1):
            text, hole = pieces[k]
            if text:
                pieces[k] = (text.rstrip(_HSPACE) if hole is None else text.rstrip(), hole)
                break
    return pieces


def read_canvas(plan: CanvasPlan, tokens: np.ndarray,
                tokenizer: Tokenizer) -> tuple[str, list[str], list[tuple[int, int]]]:
    """(line text, text of each hole, character span of each hole in the line) from a finished canvas.

    Fixed parts are the template's own strings; holes are their tokens' bytes decoded as UTF-8
    (control tokens such as an end token spell nothing); the joins as `line_pieces` makes them."""
    decoded = [tokenizer.bytes_of(tokens[s:e]).decode("utf-8", errors="replace") for s, e in plan.spans]
    out: list[str] = []
    hole_texts = [""] * len(decoded)
    char_spans = [(0, 0)] * len(decoded)
    at = 0
    for text, hole in line_pieces(plan.filled.parts, decoded):
        if hole is not None:
            hole_texts[hole] = text
            char_spans[hole] = (at, at + len(text))
        out.append(text)
        at += len(text)
    return "".join(out), hole_texts, char_spans
