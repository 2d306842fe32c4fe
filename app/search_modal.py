"""Full-text search over every saved chat (SQLite FTS5); Enter opens the chat at that message."""

from __future__ import annotations

from dgchat.app.store import (
    HIGHLIGHT_END,
    HIGHLIGHT_START,
    SearchHit,
    Store,
    StoreError,
)
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.terminal_text import one_line, terminal_safe
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option


def highlighted(snippet: str) -> Text:
    """A hit's snippet with its matches highlighted; the stored text between the markers (which are
    control characters themselves) is shown by the terminal rule."""
    text = Text()
    inside = False
    for part in snippet.replace(HIGHLIGHT_END, HIGHLIGHT_START).split(HIGHLIGHT_START):
        if part:
            text.append(terminal_safe(part), style="bold reverse" if inside else "")
        inside = not inside
    return text


class SearchModal(ModalScreen[tuple[int, int | None] | None]):
    """Dismisses with (chat id, message id or None), or None."""

    BINDINGS = [
        Binding("escape", "cancel", "Close", id="dialog.cancel"),
        Binding("down", "focus_results", "Results", show=False, id="search.results"),
    ]

    def __init__(self, store: Store, query: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.store = store
        self.initial = query
        self.hits: list[SearchHit] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide -tall"):
            yield Label("Search chats", classes="dialog--title")
            yield Input(self.initial, placeholder="words to find (prefix match)", id="search-input")
            yield Label("", id="search-count", classes="dialog--help")
            yield OptionList(id="search-results")

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self.query_one(Input).focus()
        if self.initial:
            self.run_search(self.initial)

    def run_search(self, text: str) -> None:
        try:
            self.hits = self.store.search(text)
        except StoreError as exc:  # too long, or SQLite refused it: say so where the count goes
            self.hits = []
            self.query_one(OptionList).clear_options()
            self.query_one("#search-count", Label).update(str(exc))
            return
        results = self.query_one(OptionList)
        results.clear_options()
        options = []
        for i, hit in enumerate(self.hits):
            who = {"user": "You", "assistant": "Assistant", "title": "Title"}.get(hit.role, hit.role)
            versions = hit.versions_text()
            who += f" · {versions}" if versions else ""
            prompt = Text.assemble((one_line(hit.chat_title, 200), "bold"), "  ", (who, "dim"), "\n",
                                   highlighted(hit.snippet))
            options.append(Option(prompt, id=f"hit-{i}"))
        results.add_options(options)
        count = len(self.hits)
        label = "" if not text.strip() else ("no matches" if not count else f"{count} match" + ("" if count == 1 else "es"))
        self.query_one("#search-count", Label).update(label)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.run_search(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.hits:
            self._open(0)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._open(event.option_index)

    def _open(self, index: int) -> None:
        hit = self.hits[index]
        self.dismiss((hit.chat_id, hit.message_id))

    def action_focus_results(self) -> None:
        results = self.query_one(OptionList)
        if self.hits:
            results.focus()
            if results.highlighted is None:
                results.highlighted = 0

    def action_cancel(self) -> None:
        self.dismiss(None)
