"""Edit an earlier prompt; saving re-runs the chat from there as a new version of that turn (the
earlier prompt and everything after it stay one `[`/`]` away)."""

from __future__ import annotations

from dgchat.app.save_dialog import SaveDialog
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label, Static, TextArea


class EditModal(SaveDialog[str]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel"),
        Binding("ctrl+s", "save", "Save & re-run", priority=True, id="edit.save"),
    ]

    def __init__(self, text: str) -> None:
        super().__init__(classes="dialog-screen")
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide"):
            yield Label("Edit prompt", classes="dialog--title")
            # markup=False: Rich reads "[ and ]" as a markup tag and drops it
            yield Static("Re-running keeps the earlier version: [ and ] on the prompt flip back.",
                         classes="dialog--help", markup=False)
            yield TextArea(self.text, id="edit-text", soft_wrap=True, tab_behavior="focus")
            yield Label("", id="edit-error", classes="dialog--error")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Save & re-run", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        area = self.query_one(TextArea)
        steady_cursors_when_headless(self)
        area.focus()
        area.move_cursor(area.document.end)

    def action_save(self) -> None:
        text = self.query_one(TextArea).text
        if not text.strip():
            self.query_one("#edit-error", Label).update("the prompt is empty")
            return
        self.dismiss(text)
