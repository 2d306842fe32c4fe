"""A dialog for one error message; the app keeps running behind it.

The message often quotes outside text (a server's error body, a model's name, a template's
error): it is shown by dgchat.terminal_text's rule and bounded (a server's error body can be 100 KB)."""

from __future__ import annotations

from dgchat.terminal_text import safe_document, safe_message
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
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
            yield Static(self.message, markup=False, classes="dialog--body", id="error-message")
            with Horizontal(classes="dialog--buttons"):
                yield Button("OK", variant="primary", id="ok")

    def on_mount(self) -> None:
        self.query_one("#ok", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_dismiss_dialog(self) -> None:
        self.dismiss(None)
