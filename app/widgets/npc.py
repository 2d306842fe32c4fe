"""Widgets of the NPC workshop: the card list, one batch of variants, one variant (live, then final).

A variant denoises in a compact live canvas (the chat's LiveCanvas, with a one-line head and end
tokens hidden, so the line looks like the line it becomes); once the batch is done the canvas is
replaced by the final text, fixed template text plain and the filled holes highlighted, and the
variant can be kept (k) or rejected (x)."""

from __future__ import annotations

from typing import Any

from dgchat.model_backend.engine_protocol import Engine
from dgchat.app.widgets.canvas import _PROGRESS, LiveCanvas, _wrap
from dgchat.recording.blocks import block_label
from dgchat.npc.cards import CharacterCard
from dgchat.npc.generator import LineBatch, LineVariant
from dgchat.npc.templates import line_pieces, parse_template
from dgchat.terminal_text import one_line, safe_message, terminal_safe
from rich.segment import Segment
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.strip import Strip
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

STATUS_MARK = {"new": "", "kept": "✓ kept", "rejected": "✗ rejected"}


def variant_content(batch: LineBatch, variant: LineVariant) -> Content:
    """The final line: a template's fixed text plain, each filled hole highlighted; the model's text
    (and the template's) by the terminal rule of dgchat.terminal_text."""
    spec = batch.spec
    if spec.template is None:
        return Content(terminal_safe(variant.text) or "(empty)")
    filled = parse_template(spec.template).fill(spec.variables)
    parts: list[str | tuple[str, str]] = []
    # the joins as the line was assembled (npc.templates.line_pieces): what is shown is variant.text
    for text, hole in line_pieces(filled.parts, [h.text for h in variant.holes]):
        parts.append(terminal_safe(text) if hole is None else (terminal_safe(text), "bold $accent underline"))
    return Content.assemble(*parts)


class CardList(OptionList):
    """The characters. Highlight one to write lines for it; n new, e / Enter edit, d delete."""

    BINDINGS = [
        Binding("n", "request('new')", "New", id="cards.new"),
        Binding("e", "request('edit')", "Edit", id="cards.edit"),
        Binding("d,delete", "request('delete')", "Delete", id="cards.delete"),
    ]

    class Request(Message):
        def __init__(self, action: str, card: CharacterCard | None) -> None:
            super().__init__()
            self.action = action
            self.card = card

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cards: list[CharacterCard] = []

    def set_cards(self, cards: list[CharacterCard], current: str | None) -> None:
        self.cards = list(cards)
        self.clear_options()
        options = []
        for card in cards:
            # card files come from anywhere (shared, downloaded): their text by the terminal rule
            second = one_line(card.role, 200) or "no role"
            options.append(Option(Content.assemble(one_line(card.name, 200), "\n",
                                                   (f" {one_line(card.id, 200)} · {second}", "$text-muted")),
                                  id=f"card-{card.id}"))
        self.add_options(options)
        ids = [c.id for c in cards]
        if cards:
            self.highlighted = ids.index(current) if current in ids else 0

    @property
    def current(self) -> CharacterCard | None:
        if self.highlighted is None or not 0 <= self.highlighted < len(self.cards):
            return None
        return self.cards[self.highlighted]

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Request("edit", self.current))

    def action_request(self, action: str) -> None:
        if action == "new" or self.current is not None:
            self.post_message(self.Request(action, self.current))


class VariantCanvas(LiveCanvas):
    """A variant while it denoises: one head line, then the canvas (end tokens not shown)."""

    DEFAULT_CSS = """
    VariantCanvas { height: 2; margin: 0; padding: 0; border: none; }
    """

    def __init__(self, engine: Engine, head: str, **kwargs: Any) -> None:
        super().__init__(engine, **kwargs)
        self.head = head
        self._hidden = frozenset(int(t) for t in engine.eog_ids())  # the end of the line

    def _rebuild(self) -> bool:
        width = self.content_size.width
        if width <= 0 or not self.is_mounted:
            self.refresh()
            return False
        event = self.event
        key = (id(event), width, self.head, self.stopping)
        if key == self._built_for:
            return False
        self._built_for = key  # type: ignore[assignment]
        self.frames += 1
        base = self.rich_style
        styles = self._styles()
        if event is None:
            line = f"{self.head} · waiting for the model…"
        elif self.block_size:  # written block after block (block diffusion): which block, its step
            line = f"{self.head} · {block_label(event)}"
        else:
            line = f"{self.head} · step {event.canvas_step}/{event.total_steps}"
        if self.stopping:
            line += " · stopping…"
        head = Strip([Segment(line, base + styles[_PROGRESS])]).crop(0, width).adjust_cell_length(width, base)
        strips = [head]
        if event is not None:
            strips += _wrap(self._spans(), {k: base + v for k, v in styles.items()}, width, base)
        self._strips = strips
        if len(strips) != self._height:
            self._height = len(strips)
            self.styles.height = self._height
            return True
        self.refresh()
        return False


class VariantView(Vertical, can_focus=True):
    """One variant of a line. k keeps it, x rejects it; Up / Down move between variants."""

    BINDINGS = [
        Binding("k", "mark('kept')", "Keep", id="variant.keep"),
        Binding("x", "mark('rejected')", "Reject", id="variant.reject"),
        Binding("up", "move(-1)", "Previous", show=False, id="variant.previous"),
        Binding("down", "move(1)", "Next", show=False, id="variant.next"),
    ]

    class Mark(Message):
        def __init__(self, view: VariantView, status: str) -> None:
            super().__init__()
            self.view = view
            self.status = status

    def __init__(self, index: int, seed: int, engine: Engine, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.seed = seed
        self.engine = engine
        self.batch: LineBatch | None = None
        self.canvas: VariantCanvas | None = None

    @property
    def label(self) -> str:
        return f"#{self.index + 1} · seed {self.seed}"

    def compose(self) -> ComposeResult:
        self.canvas = VariantCanvas(self.engine, self.label, classes="variant--canvas")
        yield self.canvas

    @property
    def variant(self) -> LineVariant | None:
        return self.batch.variants[self.index] if self.batch is not None else None

    def finish(self, batch: LineBatch) -> None:
        """The batch is done: show the final line instead of the canvas."""
        self.batch = batch
        if self.canvas is not None:
            self.canvas.remove()
            self.canvas = None
        self.mount(Static("", classes="variant--head", markup=False))
        self.mount(Static(variant_content(batch, batch.variants[self.index]), classes="variant--text"))
        self.refresh_state()

    def refresh_state(self) -> None:
        v = self.variant
        if v is None:
            return
        self.seed = v.seed
        parts = [self.label]
        if v.attempt:
            parts.append(f"attempt {v.attempt + 1}")
        if v.score is not None:
            parts.append(f"score {v.score:.2f}")
        if STATUS_MARK[v.status]:
            parts.append(STATUS_MARK[v.status])
        if v.problem:
            parts.append(v.problem)
        for status in ("new", "kept", "rejected"):
            self.set_class(v.status == status, f"-{status}")
        self.set_class(v.problem is not None, "-problem")
        heads = self.query(".variant--head")
        if heads:
            heads.first(Static).update(one_line(" · ".join(parts)))  # a problem may quote the model's line

    def action_mark(self, status: str) -> None:
        if self.batch is not None:
            self.post_message(self.Mark(self, status))

    def action_move(self, delta: int) -> None:
        views = list(self.screen.query(VariantView))
        if self in views:
            target = views.index(self) + delta
            if 0 <= target < len(views):
                views[target].focus()
                views[target].scroll_visible(animate=False)


class BatchView(Vertical):
    """A generated line: its title, then one VariantView per variant."""

    def __init__(self, title: str, count: int, seed: int, engine: Engine, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title_text = title
        self.count = count
        self.seed = seed
        self.engine = engine
        self.batch: LineBatch | None = None

    def compose(self) -> ComposeResult:
        yield Static(terminal_safe(self.title_text), classes="batch--title", markup=False)
        for i in range(self.count):
            yield VariantView(i, self.seed + i, self.engine, classes="variant")

    @property
    def variant_views(self) -> list[VariantView]:
        return list(self.query(VariantView))

    def finish(self, batch: LineBatch) -> None:
        self.batch = batch
        for view in self.variant_views:
            view.finish(batch)

    def set_note(self, note: str) -> None:
        """A line under the title (stopped, failed)."""
        self.mount(Static(safe_message(note), classes="batch--note", markup=False), after=0)
