"""A dialog for one error message; the app keeps running behind it.

The message often quotes outside text (a server's error body, a model's name, a template's
error): it is shown by dgchat.terminal_text's rule and bounded (a server's error body can be 100 KB)."""

from __future__ import annotations

from dgchat.terminal_text import safe_document, safe_message
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

MESSAGE_LIMIT = 4000  # characters of the message shown


class ErrorModal(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter", "dismiss_dialog", "Close", id="dialog.close")]

    def __init__(self, title: str, message: str) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = safe_document(title)
        self.message = safe_message(message, MESSAGE_LIMIT)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -error"):
            yield Label(self.title_text, classes="dialog--title")
            # a long message (model: info, a server's error body) scrolls inside the dialog; its
            # button stays on screen
            with VerticalScroll(classes="dialog--scroll"):
                yield Static(self.message, markup=False, classes="dialog--body", id="error-message")
            with Horizontal(classes="dialog--buttons"):
                yield Button("OK", variant="primary", id="ok")

    def on_mount(self) -> None:
        self.query_one("#ok", Button).focus()
        self.call_after_refresh(self._fit_text)

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit_text)

    def _fit_text(self) -> None:
        """Bound the text's height by what the dialog's 90% of the screen leaves after its title,
        border and buttons (CSS has no "the rest of an auto-height box")."""
        dialog = self.query_one(".dialog")
        text = self.query_one(".dialog--scroll")
        around = dialog.styles.gutter.height + text.styles.margin.height + sum(
            c.outer_size.height + c.styles.margin.height for c in dialog.children if c is not text)
        room = max(3, int(self.size.height * 0.9) - around)
        if text.styles.max_height is None or text.styles.max_height.value != room:
            text.styles.max_height = room

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_dismiss_dialog(self) -> None:
        self.dismiss(None)
