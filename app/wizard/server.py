"""The wizard's server form ("Use a server…" on the model step): a URL and an optional API key
instead of a model file.

The check asks the server's /v1/models once, on a worker thread, without retries (a wrong address
should say so at once), and shows what it serves: a dgchat server with the live canvas, or text
only. The ready step then connects through the session like any model; "Start chatting" writes
`[server] url` (the API key only when "save the key" is ticked, else it comes from $DGCHAT_API_KEY).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from dgchat.app.hub_task import HubTask, start_hub_task
from dgchat.app.model_source import ServerSource
from dgchat.app.widgets.tick_box import TickBox
from dgchat.app.wizard.messages import NavChanged, ServerChoice, UseServer
from dgchat.app.wizard.step import NavPlan
from dgchat.model_backend.errors import DgchatError
from dgchat.remote.client import API_KEY_ENV, RemoteClient
from dgchat.terminal_text import one_line, safe_message
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Label, Static

SERVER_CHECK_TIMEOUT = 15.0  # seconds the server form waits for /v1/models (connect and answer)
KEY_NOT_SAVED = ("Not saved: the key is used now, and later starts read it from $DGCHAT_API_KEY "
                 "(or --api-key). Tick the box to keep it in the config file.")
KEY_SAVED = "The key is saved in the config file (readable by you only)."


class ServerStep(VerticalScroll):
    """The server form, part of step 3 in the steps line."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(id="step-server", classes="wiz-step", **kwargs)
        self.checked: ServerSource | None = None  # the form's server, once /v1/models answered
        self.model = ""  # what it serves (the model the session will use)
        self.is_dgchat = False
        self.typed_key: str | None = None  # the key typed in the form (saved only if ticked)
        self.check_task: HubTask | None = None

    def compose(self) -> ComposeResult:
        yield Label("Use a server", classes="wiz--h1")
        yield Static("Chat with a model on another machine instead of downloading one: a `dgchat "
                     "serve` server (the live canvas works) or any OpenAI-compatible server such as "
                     "vLLM (answers arrive as text).", markup=False, classes="wiz--text")
        with Grid(id="srv-grid"):
            yield Label("URL", classes="hw--label")
            yield Input("", id="srv-url", compact=True, placeholder="http://gpu-box:8765")
            yield Label("API key", classes="hw--label")
            yield Input("", id="srv-key", compact=True, password=True,
                        placeholder="optional (else $DGCHAT_API_KEY)")
            yield Label("", classes="hw--label")
            yield TickBox("save the key in the config file", id="srv-save-key", compact=True)
        yield Static(KEY_NOT_SAVED, id="srv-key-note", classes="wiz--muted", markup=False)
        yield Static("", id="srv-result", markup=False)
        yield Static("", id="srv-error", classes="wiz--error", markup=False)

    # -- the screen's hooks ---------------------------------------------------------------------
    def enter(self) -> None:
        self._show_check()

    def nav_plan(self) -> NavPlan:
        checking = self.check_task is not None and self.check_task.running
        if self.checked is not None:
            label = "Next: test it"
        else:
            label = "Checking…" if checking else "Check the server"
        return NavPlan(shown=frozenset({"wiz-back"}), next_label=label,
                       next_enabled=not checking and bool(self.query_one("#srv-url", Input).value.strip()))

    def focus_target(self) -> Widget | None:
        return self.query_one("#srv-url", Input)

    def next(self) -> None:
        if self.checked is None:
            self._check()
            return
        save_key = self.query_one("#srv-save-key", Checkbox).value
        self.post_message(UseServer(ServerChoice(self.checked, self.model, self.is_dgchat, self.typed_key, save_key)))

    # -- the form -------------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.check_task is not None:
            self.check_task.close()  # its answer is for what was typed before
            self.check_task = None
        self.checked = None
        self._show_check()
        self.post_message(NavChanged())

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        if event.checkbox.id == "srv-save-key":
            event.stop()
            self.query_one("#srv-key-note", Static).update(KEY_SAVED if event.value else KEY_NOT_SAVED)

    def _show_check(self, error: str = "") -> None:
        result = self.query_one("#srv-result", Static)
        self.query_one("#srv-error", Static).update(safe_message(error))  # may quote the server's answer
        source = self.checked
        if source is None:
            result.update("")
            return
        kind = ("a dgchat server: answers draw on the live canvas" if self.is_dgchat else
                "text only: not a dgchat server, so answers arrive as text (no live canvas, no NPC lines)")
        result.update(Text.assemble(("✓ ", "bold green"), f"{source.url} serves {self.model} · {kind}"))

    def _check(self) -> None:
        url = self.query_one("#srv-url", Input).value.strip()
        typed = self.query_one("#srv-key", Input).value.strip() or None
        try:
            source = ServerSource.of(url, typed or os.environ.get(API_KEY_ENV))
        except DgchatError as exc:
            self._show_check(str(exc).replace("--server takes", "enter"))
            return
        self.checked = None
        self._show_check()
        self.query_one("#srv-result", Static).update(f"Asking {source.url} for its models…")

        def call(_progress: Any, _cancel: threading.Event) -> Any:
            with RemoteClient(source.url, api_key=source.api_key, retries=0, timeout=SERVER_CHECK_TIMEOUT,
                              connect_timeout=SERVER_CHECK_TIMEOUT) as client:
                return client.models()

        def done(models: list[Any]) -> None:
            self.check_task = None
            first = models[0]  # what RemoteEngine.connect uses
            self.checked = source
            self.typed_key = typed
            # the server names its model: shown here, in the ready step's title and status lines
            self.model = one_line(first.id, 200) + (f" (of {len(models)} models)" if len(models) > 1 else "")
            self.is_dgchat = bool(first.is_dgchat)
            self._show_check()
            self.post_message(NavChanged(focus="wiz-next"))

        def failed(exc: BaseException) -> None:
            self.check_task = None
            self._show_check(str(exc) if isinstance(exc, DgchatError) else f"{type(exc).__name__}: {exc}")
            self.post_message(NavChanged())

        self.check_task = start_hub_task(self, "server-check", call, progress=lambda p: None, done=done, failed=failed)
        self.post_message(NavChanged())

    def on_unmount(self) -> None:
        if self.check_task is not None:
            self.check_task.close()
