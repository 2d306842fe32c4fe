"""One message of the conversation: a user prompt (plain text) or a final answer (Markdown)."""

from __future__ import annotations

from typing import Any

from dgchat.app.store import Message
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TextualMessage
from textual.widgets import Label, Markdown, Static

STATUS_LABEL = {"stopped": "stopped", "error": "failed", "generating": "interrupted"}


def meta_line(message: Message) -> str:
    """'128 tokens · 64 steps · 51.2 tok/s · model' for a finished answer."""
    meta = message.meta
    parts: list[str] = []
    stats = meta.get("stats") or {}
    if stats:
        parts.append(f"{stats.get('tokens', 0)} tokens")
        parts.append(f"{stats.get('steps', 0)} steps")
        if stats.get("tokens_per_s"):
            parts.append(f"{stats['tokens_per_s']:.1f} tok/s")
    reason = meta.get("stop_reason")
    if reason == "max_tokens" and message.status == "done":
        parts.append("hit max tokens")
    if meta.get("model"):
        parts.append(str(meta["model"]))
    if meta.get("error"):
        parts.append(str(meta["error"]))
    return " · ".join(parts)


class MessageView(Vertical, can_focus=True):
    """Focus a message (Tab / click) to copy it, edit a prompt, or regenerate the last answer."""

    BINDINGS = [
        Binding("c", "copy", "Copy", id="message.copy"),
        Binding("e", "edit", "Edit & re-run", id="message.edit"),
        Binding("r", "regenerate", "Regenerate", id="message.regenerate"),
    ]

    class Action(TextualMessage):
        def __init__(self, view: MessageView, action: str) -> None:
            super().__init__()
            self.view = view
            self.action = action

    def __init__(self, message: Message, **kwargs: Any) -> None:
        classes = f"message -{message.role} -{message.status}"
        super().__init__(classes=classes, **kwargs)
        self.message = message

    def compose(self) -> ComposeResult:
        m = self.message
        who = "You" if m.role == "user" else "Assistant"
        status = STATUS_LABEL.get(m.status)
        header = who + (f" · {status}" if status else "")
        yield Label(header, classes="message--header")
        if m.role == "user":
            yield Static(m.content, markup=False, classes="message--body")
        elif m.content.strip():
            yield Markdown(m.content, classes="message--body")
        else:
            empty = "(stopped before any text was decided)" if m.status != "done" else "(empty answer)"
            yield Static(empty, markup=False, classes="message--body -empty")
        if m.role == "assistant":
            line = meta_line(m)
            if line:
                yield Label(line, markup=False, classes="message--meta")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "edit":
            return self.message.role == "user"
        if action == "regenerate":
            return self.message.role == "assistant"
        return True

    def action_copy(self) -> None:
        self.post_message(self.Action(self, "copy"))

    def action_edit(self) -> None:
        self.post_message(self.Action(self, "edit"))

    def action_regenerate(self) -> None:
        self.post_message(self.Action(self, "regenerate"))
