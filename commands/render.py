"""Rich rendering of a denoising step for `dgchat generate --visual`."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.events import StepEvent

PLACEHOLDER = "·"
STYLE = {
    Cell.MASKED: "dim",
    Cell.NEW: "bold black on yellow",
    Cell.DONE: "",
    Cell.FIXED: "cyan",
}


def canvas_text(engine, event: StepEvent) -> Text:
    text = Text()
    for tok in event.answer_tokens:
        text.append(engine.piece(int(tok)))
    for tok, state in zip(event.canvas.tokens, event.canvas.state):
        state = Cell(int(state))
        if state == Cell.MASKED:
            # uniform-state canvases hold draft tokens: show them dimmed; masks show as a dot
            text.append(engine.piece(int(tok)) if event.uniform_state else PLACEHOLDER, style="dim italic")
        else:
            text.append(engine.piece(int(tok)), style=STYLE[state])
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
