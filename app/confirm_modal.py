"""Yes / no question (deleting a chat, removing or downloading a model).

The question names chats, cards and models, outside text: shown by dgchat.terminal_text's rule,
and the title as text, not markup (a card named "[b]Brann" is called that)."""

from __future__ import annotations

from typing import Literal

from dgchat.terminal_text import one_line, safe_message
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmBody(VerticalScroll):
    """The question, scrolling when it is longer than a small terminal allows (the buttons stay on
    screen: its max-height in dgchat.tcss); a tab stop only then."""

    def allow_focus(self) -> bool:
        return self.max_scroll_y > 0


class ConfirmModal(ModalScreen[bool]):
    BINDINGS = [
        Binding("escape", "answer(False)", "Cancel", id="dialog.cancel"),
        Binding("y", "answer(True)", "Yes", show=False, id="dialog.yes"),
    ]

    def __init__(self, title: str, message: str, confirm_label: str = "Delete",
                 confirm_variant: Literal["default", "primary", "success", "warning", "error"] = "error", *,
                 focus_confirm: bool = False) -> None:
        """`confirm_variant`: the confirm button's colour (red for what destroys, primary otherwise);
        `focus_confirm`: Enter confirms (a question whose answer is what the user just asked for, such
        as a download); by default Cancel has the focus, so that Enter never destroys anything."""
        super().__init__(classes="dialog-screen")
        self.title_text = one_line(title, 200)
        self.message = safe_message(message, 4000)
        self.confirm_label = confirm_label
        self.confirm_variant = confirm_variant
        self.focus_confirm = focus_confirm

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(Content(self.title_text), classes="dialog--title")
            with ConfirmBody():
                yield Static(self.message, markup=False, classes="dialog--body")
            with Horizontal(classes="dialog--buttons"):
                yield Button(self.confirm_label, variant=self.confirm_variant, id="yes")
                yield Button("Cancel", id="no")

    def on_mount(self) -> None:
        self.query_one("#yes" if self.focus_confirm else "#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
