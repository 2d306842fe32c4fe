"""A tokenized windows file of the training recipe (train.npz / val.npz): windows and their turn spans.

Its own module so that train_default (which trains on teacher answers) and distill (which makes
them from the same windows) both use it without importing each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class Windows:
    """Tokenized windows (read with allow_pickle=False) and their turn spans."""

    def __init__(self, path: Path):
        with np.load(path, allow_pickle=False) as z:
            self.tokens = z["tokens"].astype(np.int64)
            self.seq_offsets = z["seq_offsets"]
            self.turns = z["turns"]
            self.turn_offsets = z["turn_offsets"]

    def __len__(self) -> int:
        return len(self.seq_offsets) - 1

    def ids(self, i: int) -> np.ndarray:
        return self.tokens[self.seq_offsets[i]:self.seq_offsets[i + 1]]

    def spans(self, i: int) -> np.ndarray:
        return self.turns[self.turn_offsets[i]:self.turn_offsets[i + 1]]
