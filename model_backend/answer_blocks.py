"""The finished canvases of an answer: what block diffusion (SDAR, BD3LM) and DiffusionGemma share.

Both write an answer canvas after canvas (a 4-32-token block, a 256-token DiffusionGemma canvas):
each finished canvas is appended, cut at its first end token (which ends the answer), and the answer
ends at `max_tokens` at the latest. A cancelled generation keeps the part of the canvas in progress
that was decided from its start, without end tokens.
"""

from __future__ import annotations

import numpy as np


class AnswerBlocks:
    """The tokens of an answer's finished canvases, and why it ended (`stop`)."""

    def __init__(self, max_tokens: int, is_eog: np.ndarray, *, early_stop: bool = True) -> None:
        self.max_tokens = int(max_tokens)
        self.is_eog = is_eog  # bool per vocabulary id
        self.early_stop = early_stop  # off (benchmarks: answers of exactly max_tokens): end tokens end nothing
        self.stop = "max_tokens"
        self._parts: list[np.ndarray] = []
        self._joined: np.ndarray | None = np.empty(0, np.int32)
        self._n = 0

    @property
    def n(self) -> int:
        """Tokens appended so far (before the max_tokens cut)."""
        return self._n

    def so_far(self) -> np.ndarray:
        """The finished canvases joined (StepEvent.answer_tokens); the same array until one is added."""
        if self._joined is None:
            self._joined = np.concatenate(self._parts).astype(np.int32) if self._parts else np.empty(0, np.int32)
        return self._joined

    def _add(self, tokens: np.ndarray) -> None:
        self._parts.append(np.asarray(tokens, dtype=np.int32).copy())
        self._n += int(tokens.size)
        self._joined = None

    def finish(self, canvas: np.ndarray) -> bool:
        """Append a finished canvas. True when the answer is over: the canvas holds an end token (cut
        there, stop "eos") or the answer reached max_tokens."""
        ends = np.flatnonzero(self.is_eog[canvas]) if self.early_stop else np.empty(0, np.int64)
        if ends.size:
            self._add(canvas[: ends[0]])
            self.stop = "eos"
            return True
        self._add(canvas)
        return self._n >= self.max_tokens

    def complete(self, canvas: np.ndarray) -> None:
        """Append an infill canvas as it stands: the answer is exactly it."""
        self._add(canvas)
        self.stop = "complete"

    def cancel(self, decided: np.ndarray) -> None:
        """The generation was cancelled: keep the canvas's decided prefix, without end tokens."""
        self._add(decided[~self.is_eog[decided]] if decided.size else decided)
        self.stop = "cancelled"

    def tokens(self) -> np.ndarray:
        """The answer: every canvas joined, at most max_tokens."""
        return self.so_far()[: self.max_tokens]
