"""Answers written block after block (block diffusion: SDAR, BD3LM; docs/BLOCK_DIFFUSION.md).

Such a model writes its answer as many small canvases, one block of B tokens each (a 256-token
answer at B = 4 is 64 canvases), every block denoised in a few steps against the finished ones. A
canvas count means little there, so the progress lines of the app's live canvas, of `dgchat
generate --visual` and of recordings count blocks and the answer's tokens instead:
`block 12 · step 3/4 · 47 tokens`. Which answers are block answers: those of an engine whose
family is `block_diffusion` (its block size is the file's `dgchat.engine.attention_block`), and
recordings that say so (recording.history keeps the block size).
"""

from __future__ import annotations

from dgchat.model_backend.architectures import MAX_ATTENTION_BLOCK
from dgchat.model_backend.events import StepEvent
from dgchat.model_backend.model_info import BLOCK_DIFFUSION



def block_size_of(source: object) -> int | None:
    """The block size B when `source` (an engine) writes its answers block after block, else None."""
    info = getattr(source, "info", None)
    if getattr(info, "family", None) != BLOCK_DIFFUSION:
        return None
    block = getattr(info, "attention_block", None)
    if isinstance(block, bool) or not isinstance(block, int) or not 0 < block <= MAX_ATTENTION_BLOCK:
        return None
    return block


def decided_count(event: StepEvent) -> int:
    """Tokens of the answer decided so far: the finished blocks and the current block's decided ones."""
    return int(event.answer_tokens.size) + int(event.committed)


def block_label(event: StepEvent) -> str:
    """`block 12 · step 3/4`: which block (1-based) and the step within it."""
    return f"block {event.canvas_index + 1} · step {event.canvas_step}/{event.total_steps}"
