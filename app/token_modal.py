"""`TokenModal`: the Hugging Face token dialog the wizard and the Models screen open when a gated
model needs one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dgchat.app.hub_task import HubTask, start_hub_task
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.hub import Progress, store_token
from dgchat.model_backend.errors import DgchatError
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static


class TokenModal(ModalScreen[bool]):
    """Ask for a Hugging Face access token for a gated repo, check it with the hub and store it in
    the hub's own token storage (dgchat.hub.store_token). Dismisses with True once stored."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, repo: str, message: str, had_token: bool) -> None:
        super().__init__(classes="dialog-screen")
        self.repo = repo
        self.message = message
        self.had_token = had_token
        self._store_task: HubTask | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide", id="token-dialog"):
            yield Label("Hugging Face token", classes="dialog--title")
            yield Static(self.message, markup=False, classes="dialog--body", id="token-why")
            yield Static(
                f"1. Open https://huggingface.co/{self.repo} and accept the licence (once).\n"
                "2. Create a read token at https://huggingface.co/settings/tokens and paste it below.\n"
                "It is checked with the hub and kept in the hub's own token file (~/.cache/huggingface), "
                "where every Hugging Face tool finds it.",
                markup=False, classes="dialog--help",
            )
            yield Input(placeholder="hf_…", password=True, id="token-value")
            yield Label("", id="token-error", classes="dialog--error", markup=False)
            with Horizontal(classes="dialog--buttons"):
                yield Button("Save token and retry", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "ok":
            self._submit()
        else:
            self.action_cancel()

    def _submit(self) -> None:
        if self._store_task is not None and self._store_task.running:
            return
        token = self.query_one(Input).value.strip()
        error = self.query_one("#token-error", Label)
        if not token:
            error.update("paste a token first")
            return
        error.update("Checking the token with the hub…")
        self.query_one("#ok", Button).disabled = True

        def call(_progress: Callable[[Progress], None], _cancel: threading.Event) -> Any:
            return store_token(token)

        self._store_task = start_hub_task(self, "store-token", call, progress=lambda p: None,
                                    done=self._stored, failed=self._rejected)

    def _stored(self, _info: Any) -> None:
        self.dismiss(True)

    def _rejected(self, exc: BaseException) -> None:
        self.query_one("#token-error", Label).update(str(exc) if isinstance(exc, DgchatError) else
                                                     f"{type(exc).__name__}: {exc}")
        self.query_one("#ok", Button).disabled = False
        self.query_one(Input).focus()

    def action_cancel(self) -> None:
        if self._store_task is not None:
            self._store_task.close()
        self.dismiss(False)
