"""A chat as a Markdown document (export), written atomically."""

from __future__ import annotations

import re
from pathlib import Path

from dgchat.app.paths import atomic_write_text
from dgchat.app.store import Chat, Message

_STATUS_NOTE = {
    "stopped": "_(stopped: partial answer)_",
    "error": "_(generation failed: partial answer)_",
    "generating": "_(still being generated when exported)_",
}


def slug(title: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()
    return s[:48] or "chat"


def default_export_path(chat: Chat, folder: Path | None = None) -> Path:
    return (folder or Path.cwd()) / f"dgchat-{chat.id}-{slug(chat.title)}.md"


def chat_markdown(chat: Chat, messages: list[Message]) -> str:
    lines = [f"# {chat.title}", ""]
    facts = []
    models = sorted({m.meta.get("model") for m in messages if m.meta.get("model")})
    if chat.model:
        facts.append(f"model: `{Path(chat.model).name}`")
    elif models:
        facts.append("model: " + ", ".join(f"`{m}`" for m in models))
    if facts:
        lines += ["> " + " · ".join(facts), ""]
    if chat.system_prompt.strip():
        lines += ["## System", "", chat.system_prompt.strip(), ""]
    for message in messages:
        lines += ["## " + ("You" if message.role == "user" else "Assistant"), ""]
        body = message.content.rstrip()
        lines.append(body if body else "_(empty)_")
        note = _STATUS_NOTE.get(message.status)
        if note and message.role == "assistant":
            lines += ["", note]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def export_chat(chat: Chat, messages: list[Message], path: str | Path) -> Path:
    path = Path(path).expanduser()
    atomic_write_text(path, chat_markdown(chat, messages))
    return path
