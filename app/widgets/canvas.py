"""The live canvas: an answer while it denoises.

Undecided positions are dim placeholders (uniform-state models: the dimmed draft token), tokens
committed in the latest step are highlighted, earlier ones are plain text; special tokens (pad, end
of turn, ...) are never drawn and nothing is drawn after the answer's end token (the rule is
model_backend.canvas_view's, shared with `dgchat generate --visual`). A thin progress line above
reads "step k/N · committed/length tokens · tok/s". The widget is fed the latest StepEvent by the
screen's refresh timer and renders only when asked, so its cost is bounded by the frame rate.

An answer written block after block (block diffusion: SDAR, BD3LM) is many small canvases, one per
block; the widget shows the answer so far with the current block filling in at its end, and its
progress line counts blocks and the answer's tokens: "block 12 · step 3/4 · 47 tokens · tok/s"
(recording.blocks). Its room below the text is kept for BLOCK_LOOKAHEAD_TOKENS tokens to come, not
for the block alone, so the conversation is laid out again every few dozen tokens, not every line.
"""

from __future__ import annotations

from typing import Any

from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.canvas_view import (
    DRAFT,
    HOLE,
    PLACEHOLDER,
    VISIBLE_CONTROLS,
    TokenText,
    shown_cells,
)
from dgchat.model_backend.events import StepEvent
from dgchat.recording.blocks import block_label, block_size_of, decided_count
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

_PROGRESS = -2  # style key of the progress line
TYPICAL_TOKEN_CELLS = 4.0
BLOCK_LOOKAHEAD_TOKENS = 64  # a block answer: room below its text for this many tokens still to come
_VISIBLE_CONTROLS = VISIBLE_CONTROLS  # (the name the NPC and drafting widgets import)


def _wrap(spans: list[tuple[str, int, int]], styles: dict[int, Style], width: int, base: Style) -> list[Strip]:
    """Lay out styled runs into lines of `width` cells: break before a token that starts with a
    space (word boundaries of BPE vocabularies), fold tokens longer than a line, honour newlines.
    Much cheaper than Rich's general wrapping, which matters at 30 repaints a second."""
    lines: list[Strip] = []
    current: list[Segment] = []
    used = 0

    def newline() -> None:
        nonlocal current, used
        if used < width:
            current.append(Segment(" " * (width - used), base))
        lines.append(Strip(current, width))
        current, used = [], 0

    for text, cells, key in spans:
        style = styles[key]
        parts = text.split("\n") if "\n" in text else (text,)
        for i, part in enumerate(parts):
            if i:
                newline()
            if not part:
                continue
            w = cells if len(parts) == 1 else cell_len(part)
            if used + w <= width:
                current.append(Segment(part, style))
                used += w
                continue
            if used and w <= width:  # the token fits on the next line: break before it
                newline()
                if part[0] == " " and w > 1:
                    part, w = part[1:], w - 1
                current.append(Segment(part, style))
                used = w
                continue
            while part:  # longer than a line: fold
                room = width - used
                head, part = chop_cells(part, room) if cell_len(part) > room else (part, "")
                current.append(Segment(head, style))
                used += cell_len(head)
                if part:
                    newline()
    if current or not lines:
        newline()
    return lines


def chop_cells(text: str, cells: int) -> tuple[str, str]:
    """Split `text` after at most `cells` cells (at least one character)."""
    total = 0
    for i, ch in enumerate(text):
        total += cell_len(ch)
        if total > cells:
            return (text[:i], text[i:]) if i else (text[:1], text[1:])
    return text, ""


def progress_text(event: StepEvent, *, stopping: bool = False, block_size: int | None = None,
                  limit: int | None = None) -> str:
    """'step 3/8 · canvas 2 · 5/32 tokens · 41.0 tok/s'; an answer written in blocks (`block_size`):
    'block 12 · step 3/4 · 47 tokens · 41.0 tok/s' (the answer's decided tokens, at most `limit`:
    a last block may run past the answer's length)."""
    decided = decided_count(event)
    if block_size and limit:
        decided = min(decided, int(limit))
    rate = decided / event.elapsed_s if event.elapsed_s > 0 else 0.0
    state = " · stopping…" if stopping else ""
    if block_size:
        return f"{block_label(event)} · {decided} tokens · {rate:.1f} tok/s{state}"
    canvas = f" · canvas {event.canvas_index + 1}" if event.canvas_index else ""
    return (
        f"step {event.canvas_step}/{event.total_steps}{canvas} · {event.committed}/{event.canvas_length} tokens"
        f" · {rate:.1f} tok/s{state}"
    )


class LiveCanvas(Widget):
    """Shows one StepEvent; `show()` replaces it.

    Drawn with Textual's line API: `show()` builds and wraps the text once per event into strips
    and repaints only the lines that changed; it asks for a new layout only when the canvas needs
    more lines than it has (it takes the room its first canvas will need when it is mounted, so
    that happens a few times per answer at most); repaints in between just hand out the cached
    strips. This keeps the UI thread's share of the CPU (and of the GIL, which the
    sampler needs too) small, so the generation runs at full speed while the canvas animates."""

    COMPONENT_CLASSES = {
        "canvas--masked",
        "canvas--draft",
        "canvas--new",
        "canvas--done",
        "canvas--fixed",
        "canvas--progress",
    }
    DEFAULT_CSS = """
    LiveCanvas { height: 2; }
    """

    def __init__(self, vocab: TokenText, *, canvas_length: int = 0, block_size: int | None = None,
                 answer_limit: int | None = None, **kwargs: Any) -> None:
        """`block_size`: the answer is written block after block (default: the engine `vocab` says
        so); `answer_limit`: tokens the answer may take at most (a block answer keeps no room past it)."""
        super().__init__(**kwargs)
        self.vocab = vocab  # the engine's vocabulary, or a recording's own (a replay)
        self.canvas_length = canvas_length  # positions the first canvas will have: its room is reserved at once
        self.block_size = block_size if block_size is not None else block_size_of(vocab)
        self.answer_limit = answer_limit
        self.event: StepEvent | None = None
        self.stopping = False
        self.frames = 0  # rebuilds (one per event shown), for tests and the benchmark
        self._strips: list[Strip] = []
        self._built_for: tuple[int, int] | None = None  # (id of the event, width)
        self._height = 0
        self._piece_cache: dict[int, tuple[str, int]] = {}
        self._hidden: frozenset[int] = frozenset()  # decided tokens not shown (a subclass's choice)
        self._canvas_styles: tuple[tuple[str, bool], dict[int, Style]] | None = None
        self._combined_styles: tuple[tuple[str, bool], Style, dict[int, Style]] | None = None

    def progress_line(self, event: StepEvent) -> str:
        """The line above the text: progress_text (a replay's canvas counts the answer's tokens)."""
        return progress_text(event, stopping=self.stopping, block_size=self.block_size, limit=self.answer_limit)

    def show(self, event: StepEvent) -> bool:
        """Display `event`; True when the canvas changed height (the layout changes)."""
        self.event = event
        return self._rebuild()

    @property
    def text_lines(self) -> int:
        """Lines drawn now (the progress line and the text), without the room kept below them."""
        return len(self._strips)

    def mark_stopping(self) -> None:
        self.stopping = True
        self._built_for = None
        self._rebuild()

    def on_resize(self) -> None:
        self.replan()

    def replan(self) -> None:
        """Size the canvas afresh from the current event (the reserved room depends on the width,
        and otherwise on which steps happened to be painted)."""
        self._built_for = None
        self._height = 0
        self._rebuild()

    def _styles(self) -> dict[int, Style]:
        key = (self.app.theme, self.app.no_color)
        if self._canvas_styles is not None and self._canvas_styles[0] == key:
            return self._canvas_styles[1]
        styles = self._compute_styles()
        self._canvas_styles = (key, styles)
        return styles

    def _compute_styles(self) -> dict[int, Style]:
        get = self.get_component_rich_style
        styles = {
            Cell.MASKED: get("canvas--masked", partial=True),
            Cell.NEW: get("canvas--new", partial=True),
            Cell.DONE: get("canvas--done", partial=True),
            Cell.FIXED: get("canvas--fixed", partial=True),
            DRAFT: get("canvas--draft", partial=True),
            _PROGRESS: get("canvas--progress", partial=True),
        }
        if self.app.no_color:  # no colours to tell states apart: use attributes
            styles[Cell.NEW] = styles[Cell.NEW] + Style(reverse=True)
        return styles

    def canvas_text(self) -> Text:
        """The canvas as styled text (what the lines show, unwrapped)."""
        text = Text()
        if self.event is None:
            return text
        styles = self._styles()
        for chunk, _, key in self._spans():
            text.append(chunk, styles[key])
        return text

    def _piece(self, token: int) -> tuple[str, int]:
        """Display text of a token (control characters made visible) and its width in cells."""
        cached = self._piece_cache.get(token)
        if cached is None:
            text = self.vocab.piece(token).translate(_VISIBLE_CONTROLS)
            cached = (text, cell_len(text.replace("\n", "")))
            self._piece_cache[token] = cached
        return cached

    def _spans(self) -> list[tuple[str, int, int]]:
        """(text, width, style key) of each shown position of the current canvas, in order."""
        event = self.event
        assert event is not None
        piece = self._piece
        hidden = self._hidden
        spans: list[tuple[str, int, int]] = []
        for tok, key in shown_cells(event, self.vocab):
            if tok == HOLE:
                spans.append((PLACEHOLDER, 1, Cell.MASKED))
            elif tok not in hidden:
                text, width = piece(tok)
                spans.append((text, width, key))
        return spans

    def _rebuild(self) -> bool:
        width = self.content_size.width
        if width <= 0 or not self.is_mounted:
            self.refresh()
            return False
        key = (id(self.event), width)
        if key == self._built_for:
            return False
        self._built_for = key
        self.frames += 1
        base, styles = self._line_styles()
        progress_style = styles[_PROGRESS]
        old = self._strips
        if self.event is None:
            head = Segment("waiting for the first step…"[:width], progress_style)
            self._strips = [Strip([head]).adjust_cell_length(width, base)]
        else:
            line = self.progress_line(self.event)
            head = Strip([Segment(line, progress_style)]).crop(0, width).adjust_cell_length(width, base)
            self._strips = [head, *_wrap(self._spans(), styles, width, base)]
        needed = len(self._strips)
        if self.event is None:
            needed = max(needed, 1 + self._planned_rows(width))
        if needed > self._height:
            # A new height means a new layout of the whole conversation (costly, and it scrolls):
            # reserve room for the undecided positions at the width tokens have had so far, so the
            # canvas grows a few times per answer instead of every few steps. It never shrinks.
            self._height = needed + self._room_to_grow(width)
            self.styles.height = self._height
            return True
        self._refresh_changed(old, width)
        return False

    def _refresh_changed(self, old: list[Strip], width: int) -> None:
        """Repaint only the lines that differ from the last frame. A step decides a few tokens, so
        usually the progress line and a line or two of text change; Textual then renders and writes
        those rows alone instead of the whole canvas."""
        new = self._strips
        regions: list[Region] = []
        first: int | None = None
        for y in range(max(len(old), len(new)) + 1):
            same = y >= len(old) and y >= len(new) or (y < len(old) and y < len(new) and old[y] == new[y])
            if not same and first is None:
                first = y
            elif same and first is not None:
                regions.append(Region(0, first, width, y - first))
                first = None
        if regions:
            self.refresh(*regions)

    def _line_styles(self) -> tuple[Style, dict[int, Style]]:
        """The widget's own style and each cell state's style on top of it (cached per theme)."""
        key = (self.app.theme, self.app.no_color)
        cached = self._combined_styles
        if cached is None or cached[0] != key:
            base = self.rich_style
            cached = (key, base, {k: base + v for k, v in self._styles().items()})
            self._combined_styles = cached
        return cached[1], cached[2]

    def _ahead(self, decided: int) -> int:
        """A block answer: tokens still to come that its room is kept for (none for other answers,
        whose canvas holds all of them as placeholders)."""
        if not self.block_size:
            return 0
        ahead = BLOCK_LOOKAHEAD_TOKENS
        if self.answer_limit:
            ahead = min(ahead, max(0, int(self.answer_limit) - decided))
        return ahead

    def _planned_rows(self, width: int) -> int:
        """Lines for a canvas of `canvas_length` undecided positions once they are decided, at
        English's ~4 cells a token: taken when the canvas is mounted, so that the first steps do not
        each make the conversation lay out again (a block answer: its first tokens to come)."""
        tokens = max(self.canvas_length, self._ahead(0))
        return -(-tokens * int(TYPICAL_TOKEN_CELLS) // width) if tokens else 0

    def _room_to_grow(self, width: int) -> int:
        event = self.event
        if event is None or event.uniform_state:
            return 0
        # only what is shown: positions after the answer's end token will never take room
        spans = self._spans()
        undecided = sum(1 for _, _, key in spans if key == Cell.MASKED)
        # a block answer: the blocks after this one are not on the canvas yet; keep room for some
        # (none once the block holds the answer's end)
        ahead = self._ahead(decided_count(event))
        if ahead and any(state != Cell.MASKED and self.vocab.is_end(token) for token, state
                         in zip(event.canvas.tokens.tolist(), event.canvas.state.tolist())):
            ahead = 0
        if not undecided and not ahead:
            return 0
        decided = [width for _, width, key in spans if key != Cell.MASKED]
        measured = sum(decided) / len(decided) if decided else 0.0
        # early on few tokens are known: assume at least English's ~4 cells a token
        avg = measured if len(decided) >= 16 else max(measured, TYPICAL_TOKEN_CELLS)
        return int((undecided * max(0.0, avg - 1.0) + ahead * avg) // width) + 1

    def render_line(self, y: int) -> Strip:
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.content_size.width, self.rich_style)
