"""The drafting screen's proposal, shown in place: the document around the span as plain text and,
at the span, the canvas denoising live (undecided positions as dim dots, the latest commits
highlighted), then the finished proposal highlighted until it is accepted or rejected.

A model that writes left to right (block diffusion) proposes block after block: the preview shows
the finished blocks and the current one at the span, up to the span's length for a rewrite (its
last block may run past it; those positions are not part of the proposal).

It stands in for the TextArea while a proposal is open, starting at the document line that was at
the top of the editor, so the span stays where it was on screen. Drawn with the line API from word
runs (the chat canvas's `_wrap`), rebuilt only when a new step arrives or the width changes.
"""

from __future__ import annotations

import re
from typing import Any

from dgchat.model_backend.engine_protocol import Engine
from dgchat.app.widgets.canvas import _VISIBLE_CONTROLS, PLACEHOLDER, _wrap
from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.events import StepEvent
from rich.cells import cell_len
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

_WORDS = re.compile(r"\s*\S+|\s+")
_TEXT, _PROPOSAL, _MASKED, _NEW, _DONE, _DRAFT = range(10, 16)
WINDOW_CHARS = 6000  # document text drawn on each side of the span at most


def _word_runs(text: str, key: int) -> list[tuple[str, int, int]]:
    text = text.translate(_VISIBLE_CONTROLS)
    return [(w, cell_len(w.replace("\n", "")), key) for w in _WORDS.findall(text)]


class DraftPreview(Widget):
    COMPONENT_CLASSES = {
        "preview--text",
        "preview--proposal",
        "preview--masked",
        "preview--new",
        "preview--done",
        "preview--draft",
    }
    DEFAULT_CSS = """
    DraftPreview { height: 1; }
    DraftPreview > .preview--proposal { background: $accent 30%; }
    DraftPreview > .preview--masked { color: $text-disabled; }
    DraftPreview > .preview--new { background: $accent 45%; text-style: bold; }
    DraftPreview > .preview--done { background: $accent 15%; }
    DraftPreview > .preview--draft { color: $text-disabled; text-style: italic; }
    """

    def __init__(self, engine: Engine | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine = engine
        self.kind = "rewrite"
        self.span = 0
        self.left_to_right = False
        self.event: StepEvent | None = None
        self.text: str | None = None  # the finished proposal
        self.frames = 0
        self._before: list[tuple[str, int, int]] = []
        self._after: list[tuple[str, int, int]] = []
        self._ends: set[int] = set()
        self._pieces: dict[int, tuple[str, int]] = {}
        self._strips: list[Strip] = []
        self._built_for: tuple[Any, ...] | None = None
        self._height = 0

    def start(self, engine: Engine, before: str, after: str, kind: str, span: int = 0, *,
              left_to_right: bool = False) -> None:
        """A new proposal between `before` and `after` (the document text drawn around it);
        `left_to_right`: written block after block (the span is its whole length, not one canvas)."""
        if engine is not self.engine:
            self._pieces.clear()
        self.engine = engine
        self._ends = {int(t) for t in engine.eog_ids()} if engine is not None else set()
        if len(before) > WINDOW_CHARS:
            cut = before.find("\n", len(before) - WINDOW_CHARS)
            before = before[cut + 1:] if cut >= 0 else before[-WINDOW_CHARS:]
        self._before = _word_runs(before, _TEXT)
        self._after = _word_runs(after[:WINDOW_CHARS], _TEXT)
        self.kind = kind
        self.span = span
        self.left_to_right = left_to_right
        self.event = None
        self.text = None
        self._built_for = None
        self._rebuild(scroll=True)

    def show(self, event: StepEvent, span: int) -> None:
        self.event = event
        self.span = span
        self._rebuild()

    def finish(self, text: str) -> None:
        self.text = text
        self._rebuild(scroll=True)

    def on_resize(self) -> None:
        self._built_for = None
        self._rebuild(scroll=True)

    # -- drawing --------------------------------------------------------------------------------
    def _piece(self, token: int) -> tuple[str, int]:
        cached = self._pieces.get(token)
        if cached is None:
            text = self.engine.piece(token).translate(_VISIBLE_CONTROLS)
            cached = (text, cell_len(text.replace("\n", "")))
            self._pieces[token] = cached
        return cached

    def _proposal_runs(self) -> list[tuple[str, int, int]]:
        if self.text is not None:
            runs = _word_runs(self.text, _PROPOSAL)
            return runs or [("∅", 1, _MASKED)]  # an empty proposal: still show where it goes
        event = self.event
        if event is None:
            return [(PLACEHOLDER * max(1, min(self.span, 64)), max(1, min(self.span, 64)), _MASKED)]
        runs: list[tuple[str, int, int]] = []
        ends = self._ends
        answer = event.answer_tokens.tolist()
        tokens = event.canvas.tokens.tolist()
        states = event.canvas.state.tolist()
        if self.kind == "rewrite" and self.left_to_right:
            # blocks: the span is the earlier blocks and the current one, cut at its length
            answer = answer[: self.span]
            room = max(0, self.span - len(answer))
            tokens, states = tokens[:room], states[:room]
        elif self.kind == "rewrite":
            tokens, states = tokens[: self.span], states[: self.span]
        for tok in answer:
            if tok not in ends:
                text, width = self._piece(tok)
                runs.append((text, width, _DONE))
        uniform = event.uniform_state
        for tok, state in zip(tokens, states):
            if state == Cell.MASKED:
                if uniform:
                    text, width = self._piece(tok)
                    runs.append((text, width, _DRAFT))
                else:
                    runs.append((PLACEHOLDER, 1, _MASKED))
            elif tok in ends:
                if self.kind == "continue":
                    break  # the continuation ends here
            else:
                text, width = self._piece(tok)
                runs.append((text, width, _NEW if state == Cell.NEW else _DONE))
        return runs

    def _styles(self) -> dict[int, Style]:
        base = self.rich_style
        get = self.get_component_rich_style
        return {
            _TEXT: base,
            _PROPOSAL: base + get("preview--proposal", partial=True),
            _MASKED: base + get("preview--masked", partial=True),
            _NEW: base + get("preview--new", partial=True),
            _DONE: base + get("preview--done", partial=True),
            _DRAFT: base + get("preview--draft", partial=True),
        }

    def _rebuild(self, scroll: bool = False) -> None:
        width = self.content_size.width
        if width <= 0 or not self.is_mounted:
            self.refresh()
            return
        key = (id(self.event), self.text, width)
        if key == self._built_for and not scroll:
            return
        self._built_for = key
        self.frames += 1
        styles = self._styles()
        base = self.rich_style
        proposal = self._proposal_runs()
        self._strips = _wrap(self._before + proposal + self._after, styles, width, base)
        if len(self._strips) != self._height:
            self._height = len(self._strips)
            self.styles.height = self._height
        self.refresh()
        if scroll and self.parent is not None:
            # which lines the span covers: it starts on the last line of the text before it
            first = len(_wrap(self._before, styles, width, base)) - 1 if self._before else 0
            last = len(_wrap(self._before + proposal, styles, width, base)) - 1
            self.call_after_refresh(self._scroll_span, max(0, first), max(first, last))

    def _scroll_span(self, a: int, b: int) -> None:
        parent = self.parent
        if isinstance(parent, Widget):
            parent.scroll_to_region(Region(0, a, max(1, self.content_size.width), b - a + 1), animate=False,
                                    immediate=True)

    def render_line(self, y: int) -> Strip:
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.content_size.width, self.rich_style)
