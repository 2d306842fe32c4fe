"""How many masked positions to commit at each step.

- Timestep schedule (Dream, `eps`): at step s of N, time runs t = 1 - s/N (1 - eps) down to eps;
  the fraction 1 - t_{s+1}/t_s of the remaining masks is committed, and everything at the last step.
- Block schedule (LLaDA): the canvas is split into blocks decoded left to right; each block's masks
  are split evenly over its steps (the first `remainder` steps take one more).
Both compute in float32 like llama.cpp's example, so counts agree with it exactly.
"""

from __future__ import annotations

import numpy as np


def timestep_transfer_count(step: int, total_steps: int, remaining: int, eps: float) -> int:
    if step >= total_steps - 1:
        return remaining
    one = np.float32(1.0)
    span = one - np.float32(eps)
    t = one - np.float32(step) / np.float32(total_steps) * span
    s = one - np.float32(step + 1) / np.float32(total_steps) * span
    return int(np.float32(remaining) * (one - s / t))


def even_split(mask_count: int, steps: int) -> list[int]:
    base, rem = divmod(mask_count, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def blocks(canvas_length: int, block_length: int | None) -> list[tuple[int, int]]:
    """[start, end) of each block inside a canvas (one block when no block length is given)."""
    if not block_length or block_length >= canvas_length:
        return [(0, canvas_length)]
    return [(s, min(s + block_length, canvas_length)) for s in range(0, canvas_length, block_length)]
