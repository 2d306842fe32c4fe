"""Where the app keeps its files: platformdirs locations, or one folder under $DGCHAT_HOME.

DGCHAT_HOME exists for tests and portable installs: with it set, nothing is read from or written
to the user's real config or data folders.
"""

from __future__ import annotations

from pathlib import Path

from dgchat.app.model_source import ServerSource
from dgchat.paths import APP_NAME, atomic_write_text, config_dir, config_path, data_dir  # noqa: F401 - re-exported


def db_path() -> Path:
    return data_dir() / "chats.db"


def clipboard_fallback_path() -> Path:
    """Where a copied message goes when the terminal cannot take it over OSC 52."""
    return data_dir() / "clipboard.txt"


def short_path(path: Path | str | ServerSource) -> str:
    """A path as users think of it: under the home folder as ~/… (a server: its URL)"""
    if isinstance(path, ServerSource):
        return path.url
    path = Path(path)
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def display_name(path: Path | str | ServerSource | None) -> str:
    """A model as the status lines name it: its file name (a server: "server host:port")."""
    if isinstance(path, ServerSource):
        return f"server {path.host}"
    return Path(path).name if path else "no model"
