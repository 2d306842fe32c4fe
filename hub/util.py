"""Small helpers of the model manager: sizes for people, sha256 with progress, file locks."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from dgchat.hub.errors import DownloadCancelled, HubError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1000, "KIB": 1024, "M": 1024**2, "MB": 1000**2, "MIB": 1024**2,
          "G": 1024**3, "GB": 1000**3, "GIB": 1024**3, "T": 1024**4, "TB": 1000**4, "TIB": 1024**4}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

HASH_CHUNK = 4 * 1024 * 1024


def format_bytes(n: int | float | None) -> str:
    """1536 -> '1.5 KiB'; None -> '?'."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def parse_size(text: str) -> int:
    """'16G', '16 GiB', '8000MB', '512' (bytes) -> bytes. K/M/G/T alone are binary units."""
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise HubError(f"not a size: {text!r} (examples: 16G, 8GiB, 12000MB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def sha256_file(path: Path, *, progress: Callable[[int, int], None] | None = None,
                cancel: threading.Event | None = None) -> str:
    """Hex sha256 of `path`; progress(done, total) per 4 MiB; raises DownloadCancelled when `cancel` is set."""
    total = os.path.getsize(path)
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as fh:
        while True:
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(f"hashing {Path(path).name} cancelled", bytes_done=done, bytes_total=total)
            chunk = fh.read(HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return h.hexdigest()


class FileLock:
    """An exclusive advisory lock on a lock file, released on close (and by the OS when the process dies).

    `FileLock(path).acquire(blocking=False)` returns False when another process (or another
    FileLock in this one) holds it."""

    # flock is per open file description, so two FileLocks in one process would not exclude each
    # other through the OS alone: an in-process set does that part
    _held: set[str] = set()
    _held_lock = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        key = str(self.path.absolute())
        with FileLock._held_lock:
            if key in FileLock._held:
                if not blocking:
                    return False
                raise HubError(f"{self.path} is already locked by this process")
            FileLock._held.add(key)  # reserved while the OS lock is taken
        fd = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _lock_fd(fd, blocking):
                os.close(fd)
                fd = None
        except BaseException:
            if fd is not None:
                os.close(fd)
            fd = None
            raise
        finally:
            if fd is None:
                with FileLock._held_lock:
                    FileLock._held.discard(key)
        if fd is None:
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        with FileLock._held_lock:
            FileLock._held.discard(str(self.path.absolute()))
        try:
            _unlock_fd(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock_fd(fd: int, blocking: bool) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_LOCK if blocking else msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            if blocking:
                raise
            return False

    def _unlock_fd(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock_fd(fd: int, blocking: bool) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            return True
        except BlockingIOError:
            return False

    def _unlock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def atomic_write_json(path: Path, data: object) -> None:
    import json

    from dgchat.paths import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n")
