"""Ask for one line of text: a chat's new title, an export path, a model path."""

from __future__ import annotations

from collections.abc import Callable

from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Button, Input, Label, Static


class PromptModal(ModalScreen[str | None]):
    """Dismisses with the text, or None when cancelled. `check` returns an error message or None;
    with a message the dialog stays open with it, so nothing typed is lost."""

    DEFAULT_CSS = """
    PromptModal .dialog--buttons Button { min-width: 10; }
    PromptModal Button:focus { text-style: bold reverse; }
    PromptModal #prompt-value:focus { border: tall $accent; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(
        self, title: str, value: str = "", *, placeholder: str = "", ok_label: str = "OK",
        check: Callable[[str], str | None] | None = None, help_text: str = "",
        suggester: Suggester | None = None,
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.value = value
        self.placeholder = placeholder
        self.ok_label = ok_label
        self.check = check
        self.help_text = help_text
        self.suggester = suggester

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog--title")
            if self.help_text:
                yield Static(self.help_text, markup=False, classes="dialog--help")
            yield Input(self.value, placeholder=self.placeholder, id="prompt-value", suggester=self.suggester)
            yield Label("", id="prompt-error", classes="dialog--error", markup=False)
            with Horizontal(classes="dialog--buttons"):
                yield Button(self.ok_label, variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self.query_one("#prompt-error", Label).display = False  # a line only when there is something to say
        self.query_one(Input).focus()

    def _accept(self) -> None:
        text = self.query_one(Input).value.strip()
        problem = self.check(text) if self.check else (None if text else "enter a value")
        if problem:
            error = self.query_one("#prompt-error", Label)
            error.update(problem)
            error.display = True
            return
        self.dismiss(text)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._accept()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._accept()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
