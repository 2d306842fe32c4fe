"""A denoising step as terminal text: the one renderer behind `dgchat generate --visual` (Rich Live),
`--record` and the app's .cast export (both as ANSI lines through a Rich console).

What is drawn follows model_backend.canvas_view (special tokens never, nothing after the answer's
end token, control characters made visible); any model text reaches a terminal or a .cast file only
through `terminal_safe`. An answer written block after block (block diffusion) counts blocks and the
answer's tokens in its progress line (recording.blocks).
"""

from __future__ import annotations

import io

from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.canvas_view import DRAFT, HOLE, PLACEHOLDER, TokenText, shown_cells, terminal_safe
from dgchat.model_backend.events import StepEvent
from dgchat.recording.blocks import block_size_of, decided_count
from rich.console import Console, Group, RenderableType
from rich.text import Text

STYLE = {
    Cell.MASKED: "dim italic",
    DRAFT: "dim italic",  # uniform-state canvases: an undecided position's draft token
    Cell.NEW: "bold black on yellow",
    Cell.DONE: "",
    Cell.FIXED: "cyan",
}


def canvas_text(vocab: TokenText, event: StepEvent) -> Text:
    """The canvas, consecutive positions of one style in one span."""
    text = Text()
    piece = vocab.piece
    run: list[str] = []
    run_key: int | None = None
    for token, key in shown_cells(event, vocab):
        if key != run_key and run:
            text.append("".join(run), style=STYLE[run_key])
            run = []
        run_key = key
        run.append(PLACEHOLDER if token == HOLE else terminal_safe(piece(token)))
    if run:
        text.append("".join(run), style=STYLE[run_key])
    return text


def progress_line(event: StepEvent, *, timings: bool = True, block_size: int | None = None) -> Text:
    """'step 12 (canvas 1, 12/24)  20/32 tokens  0.4s ...'; `timings` adds the split between
    llama.cpp and the sampler (a live run knows it, a recording does not keep it). An answer written
    in blocks (`block_size`) reads 'step 47 (block 12, 3/4)  46 tokens  0.4s ...': the block, the
    step within it and the answer's decided tokens (a block's own count says little)."""
    if block_size:
        decided = decided_count(event)
        rate = decided / event.elapsed_s if event.elapsed_s > 0 else 0.0
        line = (f"step {event.step} (block {event.canvas_index + 1}, {event.canvas_step}/{event.total_steps})  "
                f"{decided} tokens  {event.elapsed_s:.1f}s")
    else:
        rate = event.committed / event.elapsed_s if event.elapsed_s > 0 else 0.0
        line = (f"step {event.step} (canvas {event.canvas_index + 1}, {event.canvas_step}/{event.total_steps})  "
                f"{event.committed}/{event.canvas_length} tokens  {event.elapsed_s:.1f}s")
    if timings:
        line += f"  model {event.timing.model_ms:.0f} ms  sampler {event.timing.sampler_ms:.1f} ms  ~{rate:.1f} tok/s"
    return Text(line, style="bold")


def render_step(vocab: TokenText, event: StepEvent, *, timings: bool = True, block_size: int | None = None) -> Group:
    """The progress line over the canvas. `block_size`: the answer is written in blocks (default: the
    engine `vocab` says so; a recording passes its own)."""
    block_size = block_size if block_size is not None else block_size_of(vocab)
    return Group(progress_line(event, timings=timings, block_size=block_size), canvas_text(vocab, event))


def final_text(text: str, summary: str) -> Group:
    """The finished answer: a summary line over its text."""
    return Group(Text(summary, style="bold"), Text(terminal_safe(text)))


def ansi_lines(renderable: RenderableType, width: int) -> list[str]:
    """`renderable` laid out `width` cells wide, as lines with ANSI styles (no line breaks)."""
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system="256",
                      legacy_windows=False, highlight=False, emoji=False, markup=False, soft_wrap=False)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return out.rstrip("\n").split("\n") if out else []
