"""Small helpers of the model manager: sizes for people, sha256 with progress, file locks."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from dgchat.hub.errors import DownloadCancelled, HubError
from dgchat.paths import atomic_write_text

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
    return hash_file(path, progress=progress, cancel=cancel)[0]


def hash_file(path: Path, *, git_blob: bool = False, progress: Callable[[int, int], None] | None = None,
              cancel: threading.Event | None = None) -> tuple[str, str | None]:
    """(hex sha256, hex git blob sha1 or None) of `path`, in one read.

    The git blob sha1 (sha1 of b"blob <size>\\0" + content) is what the hub sends as the ETag of a
    file stored in git rather than LFS (config files, small GGUFs): checking it is the only
    verification such a file has when the catalog pins no sha256."""
    total = os.path.getsize(path)
    h = hashlib.sha256()
    g = hashlib.sha1(b"blob %d\0" % total, usedforsecurity=False) if git_blob else None
    done = 0
    with open(path, "rb") as fh:
        while True:
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(f"hashing {Path(path).name} cancelled", bytes_done=done, bytes_total=total)
            chunk = fh.read(HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            if g is not None:
                g.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return h.hexdigest(), (g.hexdigest() if g is not None else None)


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
            for _ in range(100):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                if not _lock_fd(fd, blocking):
                    os.close(fd)
                    fd = None
                    break
                # The holder may have deleted the lock file (release(unlink=True)) between our open
                # and our lock: we then hold a lock on a file nobody else can find, and a third process
                # could lock a new file at the same path. Only a lock on the file the path names now
                # counts; otherwise try again on the new file.
                if _same_file(fd, self.path):
                    break
                os.close(fd)
                fd = None
            else:  # pragma: no cover - a path deleted 100 times in a row
                raise HubError(f"{self.path}: the lock file keeps disappearing")
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

    def release(self, *, unlink: bool = False) -> None:
        """Unlock. unlink=True also deletes the lock file, while it is still held: a process that
        opened it meanwhile finds, once it gets the lock, that the path no longer names that file
        (see acquire) and starts over, so no two processes ever hold the lock at once. Deleting it
        after unlocking (as dgchat once did) let a waiting process lock the old file while another
        created and locked a new one."""
        if self._fd is None:
            return
        with FileLock._held_lock:
            FileLock._held.discard(str(self.path.absolute()))
        try:
            if unlink and sys.platform != "win32":  # Windows refuses to delete an open file
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
            _unlock_fd(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    if sys.platform == "win32":  # pragma: no cover - an open file cannot be deleted there
        return True
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


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

    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def llamacpp_module() -> ModuleType:
    """dgchat.model_backend.llamacpp, imported on first use: importing dgchat.hub loads no llama.cpp
    (docs/MODELS.md), and `dgchat --help` imports dgchat.hub. Only a measurement or a probe of the
    engine build needs it."""
    from dgchat.model_backend import llamacpp  # heavy: loads llama.cpp's shared library (~0.3 s)

    return llamacpp
