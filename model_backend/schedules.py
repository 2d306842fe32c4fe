"""How many masked positions to commit at each step.

- Timestep schedule (Dream, `eps`): at step s of N, time runs t = 1 - s/N (1 - eps) down to eps;
  the fraction 1 - t_{s+1}/t_s of the remaining masks is committed, and everything at the last step.
- Block schedule (LLaDA): the canvas is split into blocks decoded left to right; each block's masks
  are split evenly over its steps (the first `remainder` steps take one more).
Both compute in float32 like llama.cpp's example, so counts agree with it exactly.
- Linear schedule (dllm's BD3LM sampler): `linear_transfer_counts`, below.
SDAR's `get_num_transfer_tokens(block_length, steps)` is `even_split(block_length, steps)`.
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


def linear_transfer_counts(mask_count: int, steps: int) -> list[int]:
    """How many of a block's `mask_count` masks each step commits under dllm's linear schedule
    (dllm/core/samplers/utils.py `get_num_transfer_tokens` with `LinearAlphaScheduler`, not
    stochastic): at step j of N, s = (N-j-1)/N and t = (N-j)/N, the reverse-transfer probability is
    1 - (1 - alpha(s)) / (1 - alpha(t)) with alpha(x) = 1 - x evaluated in float32 (torch's), and the
    step commits round(remaining * p) (half to even, as torch.round), at most what remains. Steps
    that would commit nothing are dropped, as dllm drops them; the counts sum to mask_count."""
    one = np.float32(1.0)
    counts: list[int] = []
    remaining = int(mask_count)
    for j in range(int(steps)):
        if remaining == 0:
            break
        s = np.float32((steps - j - 1) / steps)
        t = np.float32((steps - j) / steps)
        ratio = np.float32((one - (one - s)) / (one - (one - t)))
        n = min(int(np.round(float(remaining) * (1.0 - float(ratio)))), remaining)
        remaining -= n
        if n:
            counts.append(n)
    return counts
