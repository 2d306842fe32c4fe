"""Where the app keeps its files: platformdirs locations, or one folder under $DGCHAT_HOME.

DGCHAT_HOME exists for tests and portable installs: with it set, nothing is read from or written
to the user's real config or data folders.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "dgchat"


def _home_override() -> Path | None:
    home = os.environ.get("DGCHAT_HOME")
    return Path(home).expanduser() if home else None


def config_dir() -> Path:
    home = _home_override()
    if home is not None:
        return home / "config"
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    home = _home_override()
    if home is not None:
        return home / "data"
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def config_path() -> Path:
    return config_dir() / "config.toml"


def db_path() -> Path:
    return data_dir() / "chats.db"


def clipboard_fallback_path() -> Path:
    """Where a copied message goes when the terminal cannot take it over OSC 52."""
    return data_dir() / "clipboard.txt"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically: temp file in the same folder, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
