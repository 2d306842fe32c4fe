"""Shown when there is no model to use: says so, and how to give one.

This is the first-run hook: `DgchatApp.first_run_screen()` returns this screen when no model is
configured. The first-run wizard (a later issue) replaces it there.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


def no_model_text(config_hint: str) -> str:
    return (
        "dgchat needs a text-diffusion model in GGUF format (LLaDA, Dream, RND1, DiffusionGemma), "
        "and none is configured yet.\n\n"
        "Give one in any of these ways:\n"
        "  • start with   dgchat --model PATH/TO/model.gguf\n"
        f"  • set   default_model = \"PATH/TO/model.gguf\"   in {config_hint}\n"
        "  • set the DGCHAT_MODEL environment variable\n"
        "  • open one now with the button below (or Ctrl+P → model: open)\n\n"
        "Saved chats can be read and searched without a model."
    )


class NoModelScreen(ModalScreen[str | None]):
    """Dismisses with "open" (the user wants to pick a model file) or None."""

    BINDINGS = [Binding("escape", "later", "Continue without a model", id="dialog.cancel")]

    def __init__(self, config_hint: str) -> None:
        super().__init__(classes="dialog-screen")
        self.config_hint = config_hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide", id="no-model"):
            yield Label("No model configured", classes="dialog--title")
            yield Static(no_model_text(self.config_hint), markup=False, classes="dialog--body")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Open model…", variant="primary", id="open")
                yield Button("Continue without a model", id="later")

    def on_mount(self) -> None:
        self.query_one("#open", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss("open" if event.button.id == "open" else None)

    def action_later(self) -> None:
        self.dismiss(None)
