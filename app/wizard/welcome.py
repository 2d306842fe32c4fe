"""The wizard's first step: what dgchat is, and the promise that after setup nothing leaves this
machine. Its error line says when the model catalog cannot be read (then setup cannot go on) or
when "Skip setup" could not write the config."""

from __future__ import annotations

from typing import Any

from dgchat.app.wizard.messages import GoToStep
from dgchat.app.wizard.step import NavPlan
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Label, Static

WELCOME = (
    "dgchat chats with text-diffusion language models on this computer. An answer starts as a "
    "canvas of blanks that the model fills in over a few parallel steps, and you watch it happen.\n\n"
    "Setup takes a minute: it looks at what this machine offers, suggests a model that fits, "
    "downloads it if it is not here yet, and runs a short test."
)
PROMISE = ("After this setup, nothing leaves this machine: no telemetry, no network calls. dgchat goes "
           "online only when you ask it to download a model.")


class WelcomeStep(VerticalScroll):
    """Step 1: the welcome text and the promise."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(id="step-welcome", classes="wiz-step", **kwargs)
        self.catalog_readable = True  # without the catalog there is nothing to set up

    def compose(self) -> ComposeResult:
        yield Label("Welcome to dgchat", classes="wiz--h1")
        yield Static(WELCOME, markup=False, classes="wiz--text")
        yield Static(Text.assemble(("Promise: ", "bold"), PROMISE), id="wiz-promise", classes="wiz--promise")
        yield Static("", id="wiz-welcome-error", classes="wiz--error", markup=False)

    def show_catalog_error(self, text: str) -> None:
        """The catalog could not be read: say so, and Next stays disabled."""
        self.catalog_readable = False
        self.show_error(text)

    def show_error(self, text: str) -> None:
        self.query_one("#wiz-welcome-error", Static).update(text)

    def nav_plan(self) -> NavPlan:
        return NavPlan(shown=frozenset({"wiz-skip"}), next_enabled=self.catalog_readable)

    def focus_target(self) -> Widget | None:
        return None

    def next(self) -> None:
        self.post_message(GoToStep("hardware"))
