"""Where dgchat keeps its files, and how it writes them.

Config, data and cache folders are platformdirs' user folders, or `config/`, `data/` and `cache/` under
$DGCHAT_HOME when it is set (tests and portable installs: nothing is then read from or written to
the user's real folders). Every file dgchat writes goes through `atomic_write_bytes`: a temporary
file in the same folder, fsync, then os.replace, so a crash or a full disk never leaves half a file.
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


def config_path() -> Path:
    """The program-wide config file (dgchat.config), read by the app and every subcommand."""
    return config_dir() / "config.toml"


def data_dir() -> Path:
    home = _home_override()
    if home is not None:
        return home / "data"
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Measurements and other files dgchat can make again (the machine profile)."""
    home = _home_override()
    if home is not None:
        return home / "cache"
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int | None = None) -> None:
    """Write `data` to `path` atomically. `mode`: permission bits for the new file (mkstemp's
    default is 0600, right for settings and chats; files meant to be shared pass 0o644)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str, *, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)
