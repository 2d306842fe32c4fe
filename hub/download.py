"""Resumable, verified downloads of one file from the hub.

huggingface_hub resolves the file (dgchat.hub.remote: `hf_hub_url` + `get_hf_file_metadata`); the
bytes are fetched here, because huggingface_hub 2.4.0 cannot resume across runs: its
`_download_to_tmp_and_move` writes to a process-unique `<etag>.<uuid>.incomplete` file and unlinks
it in a `finally` on any failure (cancel, Ctrl-C, a dropped connection after its retries), so a
stopped 17 GB download starts again from zero. (Within one call its `http_get` does retry a
dropped connection with a Range request, up to 5 times.)

Here a download keeps

    <models dir>/.partial/<file>.part       the bytes so far
    <models dir>/.partial/<file>.part.json  url, repo, filename, revision, commit, etag, size, sha256
    <models dir>/.partial/<file>.lock       exists only while a process works on it

and continues with `Range: bytes=<have>-` (expecting 206 and a matching Content-Range) after a
cancel, a dropped connection, or quitting the app. The GET goes to the resolve URL pinned to the
commit the HEAD reported, so a resumed file cannot mix two versions; a sidecar whose etag or size
no longer matches the hub's answer discards the partial file. The finished file is hashed (sha256)
and compared with the catalog's pin or the hub's LFS etag before it is moved into place with
os.replace; a mismatch deletes it.

Full disk: checked before the first byte (remaining bytes + a margin), and a write failing with
ENOSPC mid-transfer truncates the partial file to the last complete write and keeps it
resumable: after freeing space, pulling again continues where it stopped.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgchat.hub.errors import (
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    HubError,
    NoNetworkError,
    NotFoundOnHubError,
    TokenRequiredError,
    VerificationError,
    no_network_reason,
)
from dgchat.hub.paths import PARTIAL_DIRNAME
from dgchat.hub.remote import RemoteFile, effective_token, resolve_remote
from dgchat.hub.util import FileLock, atomic_write_json, format_bytes, hash_file

CHUNK = 256 * 1024
SPACE_MARGIN = 32 * 1024**2  # left free besides the file: the registry, the app's database, logs
PROGRESS_INTERVAL = 0.1  # seconds between progress callbacks while bytes flow
SIDECAR_VERSION = 1


@dataclass(frozen=True)
class Progress:
    """One progress report. Called from the downloading thread: a UI must hand it to its own thread."""

    phase: str  # "resolving" | "downloading" | "verifying" | "converting" | "done"
    name: str  # the file being worked on
    done: int  # bytes
    total: int | None
    speed: float | None = None  # bytes/s over the last few seconds ("downloading" only)
    eta: float | None = None  # seconds left at that speed
    resumed_from: int = 0  # bytes that were already on disk when this run started
    message: str = ""  # e.g. "connection dropped, retrying in 2 s (attempt 2 of 5)"

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class DownloadResult:
    path: Path
    size: int
    sha256: str
    verified_by: str  # "catalog sha256" | "hub LFS etag" | "hub git etag (sha1)" | "size only"
    remote: RemoteFile
    resumed_from: int  # bytes reused from an earlier partial download
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartialDownload:
    """A resumable download left in the .partial folder."""

    filename: str  # base name of the final file
    path: Path  # the .part file
    done: int
    total: int | None
    repo: str | None
    repo_filename: str | None
    revision: str | None
    commit: str | None

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None


def partial_paths(dest: Path) -> tuple[Path, Path, Path]:
    """(.part, .part.json, .lock) for a final file `dest`."""
    folder = dest.parent / PARTIAL_DIRNAME
    return folder / f"{dest.name}.part", folder / f"{dest.name}.part.json", folder / f"{dest.name}.lock"


def list_partials(models_dir: Path) -> list[PartialDownload]:
    """Downloads that can be resumed, from their sidecars (files without a readable sidecar are skipped)."""
    folder = Path(models_dir) / PARTIAL_DIRNAME
    out = []
    if not folder.is_dir():
        return out
    for part in sorted(folder.glob("*.part")):
        side = _read_sidecar(part.with_name(part.name + ".json"))
        if side is None:
            continue
        out.append(PartialDownload(
            filename=part.name[: -len(".part")], path=part, done=part.stat().st_size, total=side.get("size"),
            repo=side.get("repo"), repo_filename=side.get("filename"), revision=side.get("revision"),
            commit=side.get("commit"),
        ))
    return out


def discard_partial(dest: Path) -> bool:
    """Delete the partial download of `dest` (not while another process holds it). True if one was removed."""
    part, side, lock_path = partial_paths(Path(dest))
    lock = FileLock(lock_path)
    if not lock.acquire(blocking=False):
        raise HubError(f"{Path(dest).name} is being downloaded right now; cancel that first")
    existed = False
    try:
        existed = part.exists() or side.exists()
        part.unlink(missing_ok=True)
        side.unlink(missing_ok=True)
        return existed
    finally:
        lock.release(unlink=True)  # deleted while still held (FileLock.release)


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == SIDECAR_VERSION else None


class _Dropped(Exception):
    """The connection failed in a way worth retrying (reset, cut short, stalled, 5xx).
    `unreachable`: the server could not be reached at all, and why (errors.no_network_reason)."""

    def __init__(self, message: str, unreachable: str | None = None) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class _RangeRefused(Exception):
    """416: the partial file is not a prefix of this file."""


class _Meter:
    """Speed over a sliding window of a few seconds, and the ETA that follows from it."""

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, done: int) -> None:
        self.samples.append((t, done))
        while len(self.samples) > 2 and t - self.samples[0][0] > self.window:
            self.samples.popleft()

    def speed(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 - t0 >= 0.2 else None


def _ssl_context() -> ssl.SSLContext:
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with huggingface_hub's dependencies
        return ssl.create_default_context()


def _response_socket(resp: Any) -> socket.socket | None:
    """The socket under an http.client response, so that a cancel can shut it down mid-read."""
    raw = getattr(getattr(resp, "fp", None), "raw", None)
    sock = getattr(raw, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


class Downloader:
    """One download; use `download_file()` unless a UI wants to keep the object around."""

    def __init__(self, repo: str, filename: str, dest: Path, *, revision: str = "main",
                 token: str | bool | None = None, endpoint: str | None = None, sha256: str | None = None,
                 progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
                 retries: int = 5, retry_delay: float = 1.0, timeout: float = 30.0, reserve_copies: int = 0,
                 remote: RemoteFile | None = None) -> None:
        self.repo, self.filename, self.revision = repo, filename, revision
        self.dest = Path(dest)
        self.token = token
        self.endpoint = endpoint
        self.pinned_sha = sha256.lower() if sha256 else None
        self.on_progress = progress
        self.cancel = cancel or threading.Event()
        self.retries = retries
        self.retry_delay = retry_delay
        self.timeout = timeout
        self.reserve_copies = reserve_copies
        self.remote = remote
        self.part, self.sidecar, self.lock_path = partial_paths(self.dest)
        self.notes: list[str] = []
        self._last_report = 0.0
        self._meter = _Meter()
        self._resumed_from = 0

    # -- reporting ----------------------------------------------------------------------------------

    def _report(self, phase: str, done: int, total: int | None, *, force: bool = False, message: str = "") -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        if not force and now - self._last_report < PROGRESS_INTERVAL:
            return
        self._last_report = now
        speed = eta = None
        if phase == "downloading":
            speed = self._meter.speed()
            if speed and total:
                eta = max(total - done, 0) / speed if speed > 0 else None
        self.on_progress(Progress(phase=phase, name=self.dest.name, done=done, total=total, speed=speed, eta=eta,
                                  resumed_from=self._resumed_from, message=message))

    def _check_cancel(self, done: int, total: int | None) -> None:
        if self.cancel.is_set():
            raise DownloadCancelled(
                f"download of {self.dest.name} paused at {progress_text(done, total)}; pull it again to resume",
                resumable=True, bytes_done=done, bytes_total=total)

    # -- the job ------------------------------------------------------------------------------------

    def run(self) -> DownloadResult:
        self.part.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.lock_path)
        if not lock.acquire(blocking=False):
            raise HubError(f"{self.dest.name} is already being downloaded (by this app or another dgchat)")
        try:
            return self._run_locked()
        finally:
            # The lock file only means something while it is held: it goes on success, failure and
            # cancel alike (deleted while still held, see FileLock.release), so .partial keeps only
            # what a resume needs (.part + .part.json).
            lock.release(unlink=True)

    def _run_locked(self) -> DownloadResult:
        self._report("resolving", 0, None, force=True)
        self._check_cancel(0, None)
        remote = self.remote or resolve_remote(self.repo, self.filename, revision=self.revision, token=self.token,
                                               endpoint=self.endpoint)
        self.remote = remote
        if self.pinned_sha and remote.sha256 and remote.sha256 != self.pinned_sha:
            raise VerificationError(
                f"{self.repo}/{self.filename} on the hub (sha256 {remote.sha256[:12]}...) is not the file the "
                f"catalog pins (sha256 {self.pinned_sha[:12]}...); it changed upstream, so it was not downloaded")
        expected_sha = self.pinned_sha or remote.sha256
        # a file stored in git (not LFS) has the git blob sha1 as its ETag: without a pinned sha256
        # that is what the finished file is checked against, not its size alone
        git_sha1 = remote.git_sha1 if expected_sha is None else None
        total = remote.size
        have = self._prepare_partial(remote)
        self._resumed_from = have
        self._check_space(have, total)
        self._write_sidecar(remote)
        self._transfer(remote, have, total)
        size = self._part_size()
        if total is not None and size != total:  # pragma: no cover - _transfer guarantees it
            raise DownloadError(f"{self.dest.name}: got {size} bytes, expected {total}", resumable=True,
                                bytes_done=size, bytes_total=total)
        self._report("verifying", 0, size, force=True)
        digest, blob_sha1 = hash_file(self.part, git_blob=git_sha1 is not None, cancel=self.cancel,
                                      progress=lambda d, t: self._report("verifying", d, t))
        bad = (expected_sha is not None and digest != expected_sha) or (git_sha1 is not None and blob_sha1 != git_sha1)
        if bad:
            self.part.unlink(missing_ok=True)
            self.sidecar.unlink(missing_ok=True)
            got, want = (digest, expected_sha) if expected_sha is not None else (f"git sha1 {blob_sha1}", git_sha1)
            raise VerificationError(
                f"{self.dest.name} is corrupt: {'sha256 ' if expected_sha else ''}{str(got)[:20]}... but expected "
                f"{str(want)[:12]}...; the file was deleted, pull again to download it afresh")
        if expected_sha:
            verified_by = "catalog sha256" if self.pinned_sha else "hub LFS etag"
        else:
            verified_by = "hub git etag (sha1)" if git_sha1 else "size only"
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.part, self.dest)
        _fsync_dir(self.dest.parent)
        self.sidecar.unlink(missing_ok=True)
        self._report("done", size, size, force=True)
        return DownloadResult(path=self.dest, size=size, sha256=digest, verified_by=verified_by, remote=remote,
                              resumed_from=self._resumed_from, notes=tuple(self.notes))

    def _part_size(self) -> int:
        try:
            return self.part.stat().st_size
        except FileNotFoundError:
            return 0

    def _prepare_partial(self, remote: RemoteFile) -> int:
        """Bytes of a matching earlier partial download; a stale one is removed."""
        if not self.part.exists():
            return 0
        side = _read_sidecar(self.sidecar)
        have = self.part.stat().st_size
        stale = None
        if side is None:
            stale = "its description file is missing"
        elif (side.get("repo"), side.get("filename")) != (remote.repo, remote.filename):
            stale = "it belongs to another file"
        elif side.get("etag") != remote.etag or side.get("size") != remote.size:
            stale = "the file changed on the hub since"
        elif remote.size is not None and have > remote.size:
            stale = "it is larger than the file"
        if stale is not None:
            self.notes.append(f"an earlier partial download ({format_bytes(have)}) was discarded: {stale}")
            self.part.unlink()
            return 0
        if have:
            self.notes.append(f"resumed at {format_bytes(have)}")
        return have

    def _check_space(self, have: int, total: int | None) -> None:
        if total is None:
            return
        extra = self.reserve_copies * total
        need = max(total - have, 0) + extra + SPACE_MARGIN
        try:
            free = shutil.disk_usage(self.part.parent).free
        except OSError:
            return
        if free < need:
            raise DiskFullError(
                f"not enough disk space for {self.dest.name}: needs {format_bytes(need)} "
                f"({format_bytes(max(total - have, 0))} to download"
                + (f" + {format_bytes(extra)} to convert it" if extra else "")
                + f" + {format_bytes(SPACE_MARGIN)} margin), {format_bytes(free)} free in {self.dest.parent}",
                needed=need, free=free, resumable=have > 0, bytes_done=have, bytes_total=total)

    def _write_sidecar(self, remote: RemoteFile) -> None:
        atomic_write_json(self.sidecar, {
            "version": SIDECAR_VERSION, "url": remote.url, "repo": remote.repo, "filename": remote.filename,
            "revision": remote.revision, "commit": remote.commit, "etag": remote.etag, "size": remote.size,
            "sha256": self.pinned_sha or remote.sha256, "endpoint": remote.endpoint,
        })

    # -- transfer -----------------------------------------------------------------------------------

    def _transfer(self, remote: RemoteFile, have: int, total: int | None) -> None:
        failures = 0
        unreachable: str | None = None  # why the last attempt could not connect at all
        while True:
            if total is not None and have >= total:
                return
            self._check_cancel(have, total)
            before = have
            try:
                have, total, complete = self._fetch(remote, have, total)
                if complete:
                    return
                raise _Dropped("the connection closed before the end of the file")
            except _RangeRefused:
                self.notes.append("the server refused to resume; starting over")
                self.part.write_bytes(b"")
                have = 0
                failures += 1
                reason = "the server refused the Range request"
                unreachable = None
            except _Dropped as exc:
                have = self._part_size()
                reason = str(exc)
                unreachable = exc.unreachable
                if have > before:
                    failures = 0  # progress was made: a fresh budget of retries, as huggingface_hub does
                failures += 1
            self._check_cancel(have, total)
            if failures > self.retries:
                if unreachable is not None:
                    raise NoNetworkError(
                        f"no network connection: {unreachable}; the download of {self.dest.name} stopped at "
                        f"{progress_text(have, total)}, {format_bytes(have)} kept, pull again to resume",
                        reason=unreachable, resumable=have > 0, bytes_done=have, bytes_total=total)
                raise DownloadError(
                    f"download of {self.dest.name} failed at {progress_text(have, total)} ({reason}); "
                    f"{format_bytes(have)} kept, pull again to resume",
                    resumable=have > 0, bytes_done=have, bytes_total=total)
            delay = min(self.retry_delay * 2 ** (failures - 1), 30.0)
            self._report("downloading", have, total, force=True,
                         message=f"{reason}; retrying in {delay:.0f} s (attempt {failures} of {self.retries})")
            if self.cancel.wait(delay):
                self._check_cancel(have, total)

    def _open(self, remote: RemoteFile, offset: int) -> http.client.HTTPResponse:
        from huggingface_hub.utils import build_hf_headers

        tok = effective_token(self.token)
        headers = build_hf_headers(token=False)  # user agent only: the token must not follow redirects
        headers["Accept-Encoding"] = "identity"
        if offset:
            headers["Range"] = f"bytes={offset}-"
        req = urllib.request.Request(remote.url, headers=headers, method="GET")
        if tok:
            # unredirected: not copied onto the redirect to the CDN (a signed URL, another host)
            req.add_unredirected_header("Authorization", f"Bearer {tok}")
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=_ssl_context()))
        try:
            return opener.open(req, timeout=self.timeout)  # type: ignore[return-value]
        except urllib.error.HTTPError as exc:
            code = exc.code
            exc.close()
            if code == 416:
                raise _RangeRefused() from None
            if code in (401, 403):
                raise TokenRequiredError(
                    f"{remote.repo}: the hub refused the download (HTTP {code}); "
                    + ("your token has no access: accept the licence on the model's page" if tok else
                       "it needs a Hugging Face token: store one with `dgchat models login`"),
                    repo=remote.repo, had_token=tok is not None) from None
            if code == 404:
                raise NotFoundOnHubError(
                    f"{remote.repo}/{remote.filename} disappeared from the hub (HTTP 404)") from None
            if code in (408, 425, 429) or code >= 500:
                raise _Dropped(f"the server answered HTTP {code}") from None
            raise DownloadError(f"{remote.repo}/{remote.filename}: the server answered HTTP {code}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            host = urllib.parse.urlsplit(req.full_url).hostname or "the server"
            raise _Dropped(f"cannot connect ({reason})", no_network_reason(exc, host)) from None

    def _fetch(self, remote: RemoteFile, offset: int, total: int | None) -> tuple[int, int | None, bool]:
        """One GET from `offset`. Returns (bytes on disk, total, whether the file is complete)."""
        resp = self._open(remote, offset)
        done_event = threading.Event()
        watcher = None
        try:
            start, length, full = self._check_response(resp, offset, total)
            if full is not None:
                total = full
            if start == 0 and offset:
                self.notes.append("the server ignored the Range request; starting over")
                self._resumed_from = 0
            offset = start
            sock = _response_socket(resp)
            if sock is not None:
                watcher = threading.Thread(target=_watch_cancel, args=(self.cancel, done_event, sock), daemon=True)
                watcher.start()
            have = self._copy(resp, offset, total)
            expected_end = offset + length if length is not None else total
            complete = expected_end is not None and have >= expected_end and (total is None or have >= total)
            if total is None and length is None:
                complete = True  # neither size nor length known: a clean end of the body is the end
            return have, total, complete
        finally:
            done_event.set()
            resp.close()
            if watcher is not None:
                watcher.join()

    def _check_response(self, resp: http.client.HTTPResponse, offset: int,
                        total: int | None) -> tuple[int, int | None, int | None]:
        """(start offset of the body, body length, full size) after checking status and headers."""
        length_header = resp.headers.get("Content-Length")
        length = int(length_header) if length_header and length_header.isdigit() else None
        if resp.status == 206:
            cr = resp.headers.get("Content-Range", "")
            try:
                unit, rest = cr.split(" ", 1)
                span, full_text = rest.split("/", 1)
                first, last = (int(x) for x in span.split("-", 1))
                full = None if full_text.strip() == "*" else int(full_text)
            except ValueError:
                raise _Dropped(f"the server sent a malformed Content-Range {cr!r}") from None
            if unit != "bytes" or first != offset:
                raise _Dropped(f"the server resumed at the wrong place ({cr!r}, asked for {offset})")
            if total is not None and full is not None and full != total:
                raise DownloadError(f"{self.dest.name}: the server's file is {full} bytes, the hub said {total}")
            return offset, last - first + 1, full
        if resp.status == 200:
            if total is not None and length is not None and length != total:
                raise DownloadError(f"{self.dest.name}: the server sent {length} bytes, the hub said {total}")
            if offset:
                self.part.write_bytes(b"")  # the body is the whole file
            return 0, length, length if total is None else total
        raise _Dropped(f"unexpected HTTP {resp.status}")

    def _copy(self, resp: http.client.HTTPResponse, offset: int, total: int | None) -> int:
        """Append the body to the .part file; returns its size. Network failures raise _Dropped, a full
        disk DiskFullError (the file truncated to the last complete write), a cancel DownloadCancelled."""
        have = offset
        fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        try:
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
            self._meter.add(time.monotonic(), have)
            while True:
                if self.cancel.is_set():
                    break
                try:
                    chunk = resp.read1(CHUNK)
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    if self.cancel.is_set():
                        break
                    raise _Dropped(_net_reason(exc)) from None
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    try:
                        n = os.write(fd, view)
                    except OSError as exc:
                        self._write_failed(fd, exc, have, total)
                        raise  # pragma: no cover - _write_failed always raises
                    have += n
                    view = view[n:]
                self._meter.add(time.monotonic(), have)
                self._report("downloading", have, total)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._report("downloading", have, total, force=True)
        self._check_cancel(have, total)
        return have

    def _write_failed(self, fd: int, exc: OSError, have: int, total: int | None) -> None:
        try:
            os.ftruncate(fd, have)  # drop a torn chunk: the part file stays a clean prefix
        except OSError:
            pass
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            try:
                free = shutil.disk_usage(self.part.parent).free
            except OSError:
                free = None
            remaining = (total - have) if total is not None else None
            raise DiskFullError(
                f"disk full while downloading {self.dest.name} into {self.dest.parent}: {format_bytes(have)} of "
                f"{format_bytes(total)} kept; free {format_bytes(remaining)} more and pull again to resume",
                needed=(remaining or 0) + SPACE_MARGIN, free=free, resumable=True, bytes_done=have,
                bytes_total=total) from None
        raise DownloadError(f"cannot write {self.part}: {exc.strerror or exc}", resumable=have > 0,
                            bytes_done=have, bytes_total=total) from None


def _watch_cancel(cancel: threading.Event, done: threading.Event, sock: socket.socket) -> None:
    """Shut the socket down when `cancel` is set, so a read blocked on a stalled connection returns at once."""
    while not done.is_set():
        if cancel.wait(0.05):
            if not done.is_set():
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            return


def _net_reason(exc: BaseException) -> str:
    if isinstance(exc, http.client.IncompleteRead):
        return "the connection was cut mid-transfer"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "the connection stalled"
    if isinstance(exc, ConnectionResetError):
        return "the connection was reset"
    return f"the connection failed ({exc.__class__.__name__}: {exc})".replace(": )", ")")


def progress_text(done: int, total: int | None) -> str:
    """How far a download is, for messages: "42% (1.2 GiB of 2.9 GiB)", or the bytes alone."""
    if total:
        return f"{100 * done / total:.0f}% ({format_bytes(done)} of {format_bytes(total)})"
    return format_bytes(done)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def download_file(repo: str, filename: str, dest: Path, *, revision: str = "main", token: str | bool | None = None,
                  endpoint: str | None = None, sha256: str | None = None, progress: ProgressCallback | None = None,
                  cancel: threading.Event | None = None, retries: int = 5, retry_delay: float = 1.0,
                  timeout: float = 30.0, reserve_copies: int = 0) -> DownloadResult:
    """Download `repo`/`filename` at `revision` to `dest`, resuming a partial download of the same file.

    sha256: the expected hash (the catalog's pin); default: the hub's LFS etag.
    token: a Hugging Face token; None: HF_TOKEN or the stored login; False: none.
    endpoint: the hub; None: $HF_ENDPOINT, else huggingface.co.
    progress: called with Progress reports (from this thread); cancel: set it to stop (the partial
    file is kept: call again to resume). retries: reconnects without progress before giving up,
    waiting retry_delay x 2^n seconds (at most 30) between them. reserve_copies: room for this many
    more files of the same size in the free-space check (1 when a conversion follows).

    Raises DownloadCancelled, DiskFullError, TokenRequiredError, NotFoundOnHubError, NoNetworkError
    (the hub or its file server could not be reached at all), VerificationError, DownloadError (all
    DgchatError)."""
    return Downloader(repo, filename, Path(dest), revision=revision, token=token, endpoint=endpoint, sha256=sha256,
                      progress=progress, cancel=cancel, retries=retries, retry_delay=retry_delay, timeout=timeout,
                      reserve_copies=reserve_copies).run()


__all__ = [
    "DownloadResult", "Downloader", "PartialDownload", "Progress", "ProgressCallback", "discard_partial",
    "download_file", "list_partials", "partial_paths",
]
