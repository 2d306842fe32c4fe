"""The line under the prompt: which model, how it runs, loading progress, and on the right how
much of the model's context the conversation takes ("1,234 / 4,096 tokens")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dgchat.terminal_text import one_line
from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

# The next answer needs the conversation plus a whole canvas in the context: the count turns
# the warning colour once that would fill this share of the context, and the error colour once
# the next answer cannot fit at all.
NEAR_CONTEXT = 0.8


def context_level(tokens: int, canvas: int, context: int) -> str:
    """"ok", "near" (the next answer takes most of what is left) or "full" (it cannot fit)."""
    if context <= 0:
        return "ok"
    need = tokens + max(0, canvas)
    if need > context:
        return "full"
    if need >= NEAR_CONTEXT * context:
        return "near"
    return "ok"


def context_text(tokens: int, context: int) -> str:
    return f"{tokens:,} / {context:,} tokens"


SEPARATOR = " · "


def fit_parts(parts: Sequence[tuple[str, int]], width: int) -> str:
    """The parts (text, rank) joined in their order, leaving out whole parts until the line fits
    `width` cells: the highest rank first, and among equal ranks the rightmost. A line cut mid-word
    ("entropy ·…") lost the temperature, which matters more than the engine's name; rank 0 is never
    left out (what still does not fit is cut with an ellipsis by the label)."""
    kept = list(range(len(parts)))

    def length() -> int:
        return cell_len(SEPARATOR.join(parts[i][0] for i in kept))

    if width > 0:
        for i in sorted(range(len(parts)), key=lambda i: (-parts[i][1], -i)):
            if length() <= width or parts[i][1] <= 0:
                break
            kept.remove(i)
    return SEPARATOR.join(parts[i][0] for i in kept)


class FittedLine(Label):
    """A one-line label of parts (text, rank) that shows what fits its width (fit_parts), decided
    when it is drawn: its width changes with the terminal, the sidebar and the token count."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", markup=False, **kwargs)
        self.parts: list[tuple[str, int]] = []

    def set_parts(self, parts: Sequence[tuple[str, int]]) -> None:
        self.parts = list(parts)
        self.refresh(layout=True)

    def render(self) -> Text:
        return Text(fit_parts(self.parts, self.size.width), no_wrap=True, overflow="ellipsis")


class StatusBar(Horizontal):
    DEFAULT_CSS = """
    StatusBar { height: 1; }
    StatusBar > #status-text { width: 1fr; height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    StatusBar > #status-tokens { width: auto; margin-left: 2; display: none; }
    StatusBar > #status-tokens.-shown { display: block; }
    StatusBar > #status-tokens.-near { color: $warning; text-style: bold; }
    StatusBar > #status-tokens.-full { color: $error; text-style: bold; }
    StatusBar > ProgressBar { width: 30; display: none; }
    StatusBar.-loading > ProgressBar { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield FittedLine(id="status-text")
        yield Label("", id="status-tokens", markup=False)
        yield ProgressBar(total=100, show_eta=False, id="load-progress")

    def set_text(self, text: str) -> None:
        self.set_parts([(text, 0)])

    def set_parts(self, parts: Sequence[tuple[str, int]]) -> None:
        """The line as parts (text, rank) that `fit_parts` leaves out by rank when it is too long."""
        # the line names models (a server's model id) and quotes problems: the terminal rule, one line
        self.query_one(FittedLine).set_parts([(one_line(text, 1000), rank) for text, rank in parts])

    @property
    def full_text(self) -> str:
        """The whole line, as it reads when the terminal is wide enough."""
        return SEPARATOR.join(text for text, _ in self.query_one(FittedLine).parts)

    def set_context(self, tokens: int | None, context: int = 0, canvas: int = 0) -> None:
        """Show `tokens` of `context` (None hides the count); coloured when the next answer's
        canvas would (nearly) overflow the context."""
        label = self.query_one("#status-tokens", Label)
        if tokens is None or context <= 0:
            label.remove_class("-shown", "-near", "-full")
            return
        level = context_level(tokens, canvas, context)
        label.update(context_text(tokens, context))
        label.set_class(True, "-shown")
        label.set_class(level == "near", "-near")
        label.set_class(level == "full", "-full")
        label.tooltip = {
            "ok": "the conversation as the model reads it, of its context",
            "near": "close to the model's context: the next answer's canvas takes most of what is left",
            "full": "the next answer's canvas does not fit in the model's context: start a new chat",
        }[level]

    def set_loading(self, fraction: float | None) -> None:
        bar = self.query_one(ProgressBar)
        if fraction is None:
            self.remove_class("-loading")
            return
        self.add_class("-loading")
        bar.update(progress=round(100 * max(0.0, min(1.0, fraction))))
