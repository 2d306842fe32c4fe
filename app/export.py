"""A chat as a Markdown document, or one answer's denoising as an asciicast (export), written
atomically into a known folder.

The folder is `export_dir` from the config file, else ~/Documents/dgchat when there is a
~/Documents, else `exports/` in dgchat's data folder; never the folder dgchat happened to be
started from.

A Markdown export is a document people read, often with `cat` in a terminal: its text (titles,
prompts, answers, model names) follows dgchat.terminal_text's rule, so an answer's escape sequence
is written as ␛[2J, not as the sequence (the database keeps the exact text). A .cast recording
uses the same rule for every frame (recording/asciicast.py).
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from dgchat.app.paths import atomic_write_text, data_dir
from dgchat.app.store import Chat, Message
from dgchat.config import resolve_folder
from dgchat.recording.asciicast import MAX_WIDTH, MIN_WIDTH, Pace, asciicast, cast_title, summary_line
from dgchat.recording.history import DenoisingHistory
from dgchat.terminal_text import safe_document

_STATUS_NOTE = {
    "stopped": "_(stopped: partial answer)_",
    "error": "_(generation failed: partial answer)_",
    "generating": "_(still being generated when exported)_",
}


def slug(title: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()
    return s[:48] or "chat"


def default_export_dir() -> Path:
    """Where exports go when the config names no `export_dir`."""
    documents = Path.home() / "Documents"
    return documents / "dgchat" if documents.is_dir() else data_dir() / "exports"


def export_dir(configured: str | None) -> Path:
    """The export folder: the config's export_dir (absolute: app.config.resolve_folder, which
    load_config applied already; applying it again changes nothing), else the default."""
    return resolve_folder(configured) if configured else default_export_dir()


def default_export_path(chat: Chat, folder: Path) -> Path:
    return folder / f"dgchat-{chat.id}-{slug(chat.title)}.md"


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
        version = f" (version {message.version} of {message.versions})" if message.versions > 1 else ""
        lines += ["## " + ("You" if message.role == "user" else "Assistant") + version, ""]
        body = message.content.rstrip()
        lines.append(body if body else "_(empty)_")
        note = _STATUS_NOTE.get(message.status)
        if note and message.role == "assistant":
            lines += ["", note]
        lines.append("")
    return safe_document("\n".join(lines).rstrip("\n") + "\n")


def export_target(text: str, folder: Path) -> Path:
    """The file a path typed in the export dialog means: a relative one is inside `folder`."""
    path = Path(text.strip()).expanduser()
    return path if path.is_absolute() else folder / path


def export_problem(path: Path, example: str = "chat.md") -> str | None:
    """Why `path` cannot be an export file, before anything is written, or None."""
    if not path.name or path.is_dir():
        return f"{path} is a folder; add a file name such as {example}"
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"cannot create the folder {path.parent}: {parent} is a file"
            break
    return None


def export_chat(chat: Chat, messages: list[Message], path: str | Path) -> Path:
    """Write the chat to `path` (a temporary file renamed over it; missing folders are created).
    Raises OSError; `export_error_text` words it."""
    path = Path(path).expanduser()
    atomic_write_text(path, chat_markdown(chat, messages), mode=0o644)  # a document to share, not a secret
    return path


def export_error_text(path: Path, exc: OSError) -> str:
    """An OSError from export_chat as one sentence naming the folder or file and the reason."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write to {path.parent}: {reason.lower()}; choose another folder (export_dir in the config)"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return f"cannot create the folder {path.parent}: {reason.lower()}"
    if exc.errno == errno.ENOSPC:
        return f"no space left to write {path}"
    return f"cannot write {path}: {reason}"


def default_recording_path(chat: Chat, message: Message, folder: Path) -> Path:
    return folder / f"dgchat-{chat.id}-answer-{message.id}.cast"


def export_recording(history: DenoisingHistory, chat: Chat, message: Message, path: str | Path, *,
                     seconds_per_step: float | None, width: int) -> Path:
    """Write an answer's denoising as an asciicast (.cast) at the given pace (None: the real one),
    atomically like export_chat. Raises OSError; `export_error_text` words it."""
    stats = message.meta.get("stats") if isinstance(message.meta.get("stats"), dict) else {}

    def number(key: str) -> float:
        value = stats.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0

    summary = summary_line(int(number("tokens")), int(number("steps")), number("elapsed_s"))
    model = message.meta.get("model") if isinstance(message.meta.get("model"), str) else ""
    text = asciicast(history, message.content, summary=summary, width=max(MIN_WIDTH, min(MAX_WIDTH, width)),
                     pace=Pace(seconds_per_step), title=cast_title("dgchat", model, chat.title))
    path = Path(path).expanduser()
    atomic_write_text(path, text, mode=0o644)
    return path
