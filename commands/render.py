"""Rich rendering of a denoising step for `dgchat generate --visual`."""

from __future__ import annotations

from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.canvas_view import (
    DRAFT,
    HOLE,
    PLACEHOLDER,
    VISIBLE_CONTROLS,
    shown_cells,
)
from dgchat.model_backend.events import StepEvent
from rich.console import Group
from rich.text import Text

STYLE = {
    Cell.MASKED: "dim italic",
    DRAFT: "dim italic",  # uniform-state canvases: an undecided position's draft token
    Cell.NEW: "bold black on yellow",
    Cell.DONE: "",
    Cell.FIXED: "cyan",
}


def canvas_text(engine, event: StepEvent) -> Text:
    """The canvas by model_backend.canvas_view's rule (special tokens never drawn, nothing after the
    answer's end token, control characters made visible), consecutive positions of one style in
    one span."""
    text = Text()
    piece = engine.piece
    run: list[str] = []
    run_key: int | None = None
    for token, key in shown_cells(event, engine):
        if key != run_key and run:
            text.append("".join(run), style=STYLE[run_key])
            run = []
        run_key = key
        run.append(PLACEHOLDER if token == HOLE else piece(token).translate(VISIBLE_CONTROLS))
    if run:
        text.append("".join(run), style=STYLE[run_key])
    return text


def progress_line(event: StepEvent) -> Text:
    rate = event.committed / event.elapsed_s if event.elapsed_s > 0 else 0.0
    return Text(
        f"step {event.step} (canvas {event.canvas_index + 1}, {event.canvas_step}/{event.total_steps})  "
        f"{event.committed}/{event.canvas_length} tokens  {event.elapsed_s:.1f}s  "
        f"model {event.timing.model_ms:.0f} ms  sampler {event.timing.sampler_ms:.1f} ms  ~{rate:.1f} tok/s",
        style="bold",
    )


def render_step(engine, event: StepEvent) -> Group:
    return Group(progress_line(event), canvas_text(engine, event))
