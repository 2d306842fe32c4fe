"""An answer's denoising history: what each step changed on the canvas, compact enough to keep.

`HistoryRecorder` runs next to a generation (the worker thread that iterates the engine's events)
and keeps, per step, only the canvas positions whose token or state changed since the previous
step: their position, token id and whether the model had accepted (decided) them. The first step
of each canvas is a keyframe (every position, and the answer's tokens from earlier canvases).
It also keeps the text and kind (special, end of turn) of every token that appears, so a history
replays without the model that wrote it, and, for an answer written block after block (block
diffusion, recording.blocks), the block size, so that its replay counts blocks as the live canvas did.
A block answer is many small canvases: each block's first step is a keyframe that repeats the
answer's earlier tokens, which zlib stores as back-references (a 512-token answer in blocks of 4 is
128 keyframes: 6 KB packed on the tiny test model, 13 bytes a step).

`DenoisingHistory.to_bytes()` packs it (numpy arrays, zlib) for the chat database;
`from_bytes()` reads it back, checking every count and index, since a database file is as
untrusted as any other file (HistoryError, one line, on anything damaged). `events()` rebuilds the
StepEvents, so the app's LiveCanvas, `dgchat generate --record` and the .cast export draw a replayed
step exactly as they draw a live one.

Bounds: at most MAX_STEPS steps and MAX_CHANGES changed positions per answer are recorded; a longer
generation keeps its first part and is marked `truncated` (its replay ends early and says so).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dgchat.model_backend.architectures import MAX_ATTENTION_BLOCK
from dgchat.model_backend.canvas import CanvasSnapshot, Cell
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.events import StepEvent, StepTiming
from dgchat.recording.blocks import block_size_of

MAGIC = b"DGH\x01"  # format 1
MAX_STEPS = 16384
MAX_CHANGES = 2_000_000  # changed positions over all steps (uniform-state models change every draft)
MAX_BLOB = 64 << 20  # decompressed bytes a stored history may take

# per changed position: what the canvas holds there now
UNDECIDED = 0
ACCEPTED = 1
FIXED = 2  # given by the caller (infill), never changed

TOKEN_SPECIAL = 1
TOKEN_END = 2

_META_COLUMNS = 8  # step, canvas_index, canvas_step, total_steps, elapsed_ms, canvas_length, changes, answer_len


class HistoryError(DgchatError):
    """A stored history that cannot be read (damaged, or from a newer dgchat)."""


class TokenVocab(Protocol):
    def piece(self, token: int) -> str: ...
    def is_special(self, token: int) -> bool: ...
    def is_end(self, token: int) -> bool: ...


class RecordedVocab:
    """The text and kind of each token a history contains: an engine's piece / is_special / is_end
    for the canvases it replays."""

    def __init__(self, pieces: dict[int, tuple[str, int]]) -> None:
        self._pieces = pieces

    def piece(self, token: int) -> str:
        entry = self._pieces.get(int(token))
        return entry[0] if entry is not None else ""

    def is_special(self, token: int) -> bool:
        entry = self._pieces.get(int(token))
        return entry is not None and bool(entry[1] & TOKEN_SPECIAL)

    def is_end(self, token: int) -> bool:
        entry = self._pieces.get(int(token))
        return entry is not None and bool(entry[1] & TOKEN_END)

    def __len__(self) -> int:
        return len(self._pieces)

    def entries(self) -> list[tuple[int, str, int]]:
        """(token, text, kind flags) of every token, by token id."""
        return [(token, *self._pieces[token]) for token in sorted(self._pieces)]


def _codes(state: np.ndarray) -> np.ndarray:
    """Cell states as history codes: undecided, accepted (new or earlier) or fixed."""
    codes = np.full(state.shape, ACCEPTED, np.uint8)
    codes[state == Cell.MASKED] = UNDECIDED
    codes[state == Cell.FIXED] = FIXED
    return codes


@dataclass
class DenoisingHistory:
    uniform_state: bool = False
    truncated: bool = False
    meta: np.ndarray = field(default_factory=lambda: np.zeros((0, _META_COLUMNS), np.int32))
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    answer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # keyframes' earlier-canvas tokens
    vocab: RecordedVocab = field(default_factory=lambda: RecordedVocab({}))
    block_size: int | None = None  # the answer was written block after block, blocks of this size

    @property
    def steps(self) -> int:
        return int(self.meta.shape[0])

    def elapsed_s(self) -> list[float]:
        """When each step was shown, in seconds since the generation started."""
        return [ms / 1000.0 for ms in self.meta[:, 4].tolist()]

    # -- frames ---------------------------------------------------------------------------------
    def events(self) -> Iterator[StepEvent]:
        """The recorded steps as StepEvents (NEW marks the positions accepted in that step)."""
        at_change = at_answer = 0
        tokens = codes = np.zeros(0, np.int32)
        answer = np.zeros(0, np.int32)
        for step, canvas_index, canvas_step, total, elapsed_ms, length, changes, answer_len in self.meta.tolist():
            pos = self.positions[at_change:at_change + changes]
            tok = self.tokens[at_change:at_change + changes]
            code = self.codes[at_change:at_change + changes]
            at_change += changes
            if answer_len >= 0:  # keyframe: a new canvas
                answer = self.answer[at_answer:at_answer + answer_len].copy()
                at_answer += answer_len
                tokens = np.zeros(length, np.int32)
                codes = np.zeros(length, np.uint8)
            was_tokens, was_codes = tokens, codes
            tokens = tokens.copy()
            codes = codes.copy()
            tokens[pos] = tok
            codes[pos] = code
            state = np.full(length, Cell.DONE, np.int8)
            state[codes == UNDECIDED] = Cell.MASKED
            state[codes == FIXED] = Cell.FIXED
            # NEW: accepted in this step (a uniform-state model may also accept another token in place)
            state[(codes == ACCEPTED) & ((was_codes == UNDECIDED) | (tokens != was_tokens))] = Cell.NEW
            yield StepEvent(
                step=step, total_steps=total, canvas_index=canvas_index, canvas_step=canvas_step,
                canvas=CanvasSnapshot(tokens, state, np.zeros(length, np.float32)), answer_tokens=answer,
                committed=int(np.count_nonzero(codes != UNDECIDED)), canvas_length=length,
                timing=StepTiming(0.0, 0.0), elapsed_s=elapsed_ms / 1000.0, uniform_state=self.uniform_state,
            )

    # -- storage --------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        entries = self.vocab.entries()
        header = {
            "uniform_state": self.uniform_state,
            "truncated": self.truncated,
            "steps": self.steps,
            "changes": int(self.positions.size),
            "answer": int(self.answer.size),
            "pieces": [text for _, text, _ in entries],
        }
        if self.block_size is not None:  # absent otherwise: older dgchat reads the same header
            header["block_size"] = int(self.block_size)
        head = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
        wide = bool(self.positions.size) and int(self.positions.max()) > 0xFFFF
        parts = [
            struct.pack("<I?", len(head), wide), head,
            self.meta.astype("<i4").tobytes(),
            self.positions.astype("<u4" if wide else "<u2").tobytes(),
            self.tokens.astype("<i4").tobytes(),
            self.codes.astype("u1").tobytes(),
            self.answer.astype("<i4").tobytes(),
            np.array([token for token, _, _ in entries], "<i4").tobytes(),
            np.array([kind for _, _, kind in entries], "u1").tobytes(),
        ]
        return MAGIC + zlib.compress(b"".join(parts), 6)

    @classmethod
    def from_bytes(cls, blob: bytes) -> DenoisingHistory:
        if not isinstance(blob, (bytes, bytearray, memoryview)) or bytes(blob[:4]) != MAGIC:
            raise HistoryError("the recording is damaged or from a newer dgchat")
        try:
            inflater = zlib.decompressobj()
            data = inflater.decompress(bytes(blob[4:]), MAX_BLOB)
            if inflater.unconsumed_tail:
                raise HistoryError("the recording is too large")
            if not inflater.eof:
                raise HistoryError("the recording is cut short")
            head_len, wide = struct.unpack_from("<I?", data)
            at = 5
            header = json.loads(data[at:at + head_len].decode("utf-8", "surrogatepass"))
            at += head_len
            steps, changes, answer_len = (int(header[k]) for k in ("steps", "changes", "answer"))
            pieces = header["pieces"]
            block_size = header.get("block_size")
            if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                           or not 0 < block_size <= MAX_ATTENTION_BLOCK):
                raise HistoryError("the recording's block size is out of range")
            if not (0 <= steps <= MAX_STEPS and 0 <= changes <= MAX_CHANGES and 0 <= answer_len
                    and isinstance(pieces, list) and all(isinstance(p, str) for p in pieces)):
                raise HistoryError("the recording's counts are out of range")

            def take(dtype: str, count: int) -> np.ndarray:
                nonlocal at
                size = np.dtype(dtype).itemsize * count
                if at + size > len(data):
                    raise HistoryError("the recording is cut short")
                array = np.frombuffer(data, dtype, count, at)
                at += size
                return array

            meta = take("<i4", steps * _META_COLUMNS).reshape(steps, _META_COLUMNS).astype(np.int32)
            positions = take("<u4" if wide else "<u2", changes).astype(np.int32)
            tokens = take("<i4", changes).astype(np.int32)
            codes = take("u1", changes).astype(np.uint8)
            answer = take("<i4", answer_len).astype(np.int32)
            ids = take("<i4", len(pieces)).tolist()
            kinds = take("u1", len(pieces)).tolist()
            if at != len(data):
                raise HistoryError("the recording has bytes its header does not account for")
        except HistoryError:
            raise
        except (zlib.error, struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise HistoryError(f"the recording is damaged ({type(exc).__name__})") from None
        history = cls(bool(header.get("uniform_state")), bool(header.get("truncated")), meta, positions, tokens,
                      codes, answer, RecordedVocab({t: (p, k) for t, p, k in zip(ids, pieces, kinds)}),
                      block_size=block_size)
        history._check()
        return history

    def _check(self) -> None:
        """Every count and index consistent, so that events() cannot index out of bounds."""
        meta = self.meta
        if meta.size and ((meta[:, 5] <= 0).any() or (meta[:, 5] > (1 << 20)).any() or (meta[:, 6] < 0).any()):
            raise HistoryError("the recording's canvas sizes are out of range")
        if int(meta[:, 6].sum()) != self.positions.size:
            raise HistoryError("the recording's changes do not add up")
        keyframes = meta[:, 7] >= 0
        if meta.size and not keyframes[0]:
            raise HistoryError("the recording does not start with a whole canvas")
        if int(meta[keyframes, 7].sum()) != self.answer.size:
            raise HistoryError("the recording's answer tokens do not add up")
        lengths = np.repeat(meta[:, 5], meta[:, 6])
        if self.positions.size and ((self.positions < 0) | (self.positions >= lengths)).any():
            raise HistoryError("the recording names positions outside its canvas")
        if self.codes.size and (self.codes > FIXED).any():
            raise HistoryError("the recording has unknown position states")
        # a canvas keeps its length until the next keyframe
        length = 0
        for row_length, is_key in zip(meta[:, 5].tolist(), keyframes.tolist()):
            if is_key:
                length = row_length
            elif row_length != length:
                raise HistoryError("the recording changes a canvas's length mid-canvas")


class HistoryRecorder:
    """Collects a generation's steps (call `add` with each StepEvent, on the worker thread).
    `block_size`: the answer is written block after block (default: the engine `vocab` says so,
    recording.blocks.block_size_of)."""

    def __init__(self, vocab: TokenVocab, *, block_size: int | None = None) -> None:
        self._vocab = vocab
        self.block_size = block_size if block_size is not None else block_size_of(vocab)
        self._meta: list[tuple[int, ...]] = []
        self._positions: list[np.ndarray] = []
        self._tokens: list[np.ndarray] = []
        self._codes: list[np.ndarray] = []
        self._answer: list[np.ndarray] = []
        self._pieces: dict[int, tuple[str, int]] = {}
        self._changes = 0
        self._last: tuple[int, int, np.ndarray, np.ndarray] | None = None  # canvas index, answer size, tokens, codes
        self.uniform_state = False
        self.truncated = False

    def add(self, event: StepEvent) -> None:
        if self.truncated:
            return
        tokens = np.asarray(event.canvas.tokens, np.int32)
        codes = _codes(np.asarray(event.canvas.state))
        answer = np.asarray(event.answer_tokens, np.int32)
        last = self._last
        keyframe = (last is None or last[0] != event.canvas_index or last[1] != answer.size
                    or last[2].size != tokens.size)
        if keyframe:
            changed = np.arange(tokens.size, dtype=np.int32)
        else:
            assert last is not None
            changed = np.flatnonzero((tokens != last[2]) | (codes != last[3])).astype(np.int32)
        if len(self._meta) >= MAX_STEPS or self._changes + changed.size > MAX_CHANGES:
            self.truncated = True
            return
        self.uniform_state = self.uniform_state or bool(event.uniform_state)
        self._meta.append((event.step, event.canvas_index, event.canvas_step, event.total_steps,
                           int(round(event.elapsed_s * 1000)), tokens.size, changed.size,
                           answer.size if keyframe else -1))
        self._positions.append(changed)
        self._tokens.append(tokens[changed])
        self._codes.append(codes[changed])
        self._changes += changed.size
        if keyframe:
            self._answer.append(answer)
            self._learn(answer)
        self._learn(tokens[changed])
        self._last = (event.canvas_index, answer.size, tokens, codes)

    def _learn(self, tokens: np.ndarray) -> None:
        pieces, vocab = self._pieces, self._vocab
        for token in np.unique(tokens).tolist():
            if token not in pieces:
                kind = (TOKEN_SPECIAL if vocab.is_special(token) else 0) | (TOKEN_END if vocab.is_end(token) else 0)
                pieces[token] = (vocab.piece(token), kind)

    @property
    def steps(self) -> int:
        return len(self._meta)

    def history(self) -> DenoisingHistory:
        def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        meta = np.array(self._meta, np.int32).reshape(len(self._meta), _META_COLUMNS)
        return DenoisingHistory(self.uniform_state, self.truncated, meta, joined(self._positions, np.int32),
                                joined(self._tokens, np.int32), joined(self._codes, np.uint8),
                                joined(self._answer, np.int32), RecordedVocab(dict(self._pieces)),
                                block_size=self.block_size)
