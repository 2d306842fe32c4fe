"""Where NPC files live, and atomic writes.

The data folder follows the app's convention (app/paths.py): $DGCHAT_HOME/data when DGCHAT_HOME is
set (tests, portable installs), else platformdirs' user data dir. Cards live in <data>/npc/cards.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "dgchat"


def data_dir() -> Path:
    home = os.environ.get("DGCHAT_HOME")
    if home:
        return Path(home).expanduser() / "data"
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cards_dir() -> Path:
    return data_dir() / "npc" / "cards"


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically: temp file in the same folder, fsync, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
