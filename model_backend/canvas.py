"""The canvas: the positions a diffusion model is filling in, and what is known about each."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


def decided_length(state: np.ndarray) -> int:
    """How many positions from the start are decided: the part of an answer that stays if the
    generation stopped now (everything up to the first undecided position; cut at its first end
    token, it is what a live canvas starts with: model_backend.canvas_view)."""
    undecided = np.flatnonzero(state == Cell.MASKED)
    return int(undecided[0]) if undecided.size else int(state.size)


class Cell(IntEnum):
    """State of one canvas position, as the UI shows it."""

    MASKED = 0  # undecided: a mask token (masked diffusion) or a not-yet-accepted draft (uniform-state)
    NEW = 1  # committed in the step that just ran
    DONE = 2  # committed in an earlier step
    FIXED = 3  # given by the caller (infill templates): never changed


@dataclass
class Canvas:
    """`tokens[i]` is the current token at canvas position i (a mask id or a draft while undecided)."""

    tokens: np.ndarray
    state: np.ndarray
    confidence: np.ndarray
    committed_at: np.ndarray  # step index that committed the position, -1 while undecided

    @classmethod
    def blank(cls, length: int, fill_token: int) -> Canvas:
        return cls(
            tokens=np.full(length, fill_token, dtype=np.int32),
            state=np.zeros(length, dtype=np.int8),
            confidence=np.full(length, np.nan, dtype=np.float32),
            committed_at=np.full(length, -1, dtype=np.int32),
        )

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def undecided(self) -> np.ndarray:
        return self.state == Cell.MASKED

    @property
    def n_decided(self) -> int:
        return int(np.count_nonzero(self.state != Cell.MASKED))

    def decided_prefix(self) -> np.ndarray:
        """The tokens up to the first undecided position."""
        return self.tokens[: decided_length(self.state)]

    def commit(self, positions: np.ndarray, tokens: np.ndarray, confidence: np.ndarray, step: int) -> None:
        """Commit `tokens` at canvas `positions`; earlier NEW cells become DONE."""
        self.state[self.state == Cell.NEW] = Cell.DONE
        if positions.size:
            self.tokens[positions] = tokens
            self.state[positions] = Cell.NEW
            self.confidence[positions] = confidence
            self.committed_at[positions] = step

    def settle(self) -> None:
        self.state[self.state == Cell.NEW] = Cell.DONE

    def snapshot(self) -> CanvasSnapshot:
        return CanvasSnapshot(self.tokens.copy(), self.state.copy(), self.confidence.copy())


@dataclass(frozen=True)
class CanvasSnapshot:
    """An immutable copy handed to event consumers (the UI renders it on its own thread)."""

    tokens: np.ndarray
    state: np.ndarray
    confidence: np.ndarray = field(repr=False)

    def decided_prefix(self) -> np.ndarray:
        """The tokens up to the first undecided position."""
        return self.tokens[: decided_length(self.state)]
