"""Errors of the model manager. Each is a DgchatError with a one-line message naming the problem;
the typed subclasses let a UI react (ask for a token, offer to resume, show free space)."""

from __future__ import annotations

from dgchat.model_backend.errors import DgchatError


class HubError(DgchatError):
    """Base of every model-manager error."""


class CatalogError(HubError):
    """The model catalog (assets/catalog.toml or a user file) is not valid."""


class RegistryError(HubError):
    """The local model registry is unreadable, or a name is unknown or already taken."""


class NotFoundOnHubError(HubError):
    """The repository, revision or file does not exist on the hub (HTTP 404)."""


class TokenRequiredError(HubError):
    """The repository is gated or private and the request had no token, or one without access.

    `repo` names the repository; `had_token` tells a UI whether to ask for a token or for a
    different one (the stored token lacks access: accept the licence on the model page)."""

    def __init__(self, message: str, *, repo: str, had_token: bool) -> None:
        super().__init__(message)
        self.repo = repo
        self.had_token = had_token


class DownloadError(HubError):
    """The transfer failed (network, server). `resumable`: the partial file was kept and the next
    pull continues from `bytes_done`."""

    def __init__(self, message: str, *, resumable: bool = False, bytes_done: int = 0,
                 bytes_total: int | None = None) -> None:
        super().__init__(message)
        self.resumable = resumable
        self.bytes_done = bytes_done
        self.bytes_total = bytes_total


class NoNetworkError(DownloadError):
    """The hub could not be reached at all: its name did not resolve, the connection was refused,
    the network or host is unreachable, or the connection attempt timed out. `reason` says which
    in a few words; a UI says "No network connection" and offers what works offline."""

    def __init__(self, message: str, *, reason: str, resumable: bool = False, bytes_done: int = 0,
                 bytes_total: int | None = None) -> None:
        super().__init__(message, resumable=resumable, bytes_done=bytes_done, bytes_total=bytes_total)
        self.reason = reason


class DownloadCancelled(DownloadError):
    """The cancel event was set. The partial file is kept; pulling again resumes it."""


class DiskFullError(DownloadError):
    """Not enough free space in the models folder. `needed`/`free` are bytes (free may be None)."""

    def __init__(self, message: str, *, needed: int, free: int | None, resumable: bool = False,
                 bytes_done: int = 0, bytes_total: int | None = None) -> None:
        super().__init__(message, resumable=resumable, bytes_done=bytes_done, bytes_total=bytes_total)
        self.needed = needed
        self.free = free


class VerificationError(HubError):
    """A finished file's sha256 (or size) does not match what the hub or the catalog promised.
    The bad file has already been deleted when this is raised by a download."""


_DNS_WORDS = ("name or service not known", "nodename nor servname", "temporary failure in name resolution",
              "getaddrinfo failed", "no address associated with hostname", "name resolution")


def no_network_reason(exc: BaseException, host: str) -> str | None:
    """What kept this machine from reaching `host` at all, in a few words, or None when `exc` is
    not a failure to connect (an HTTP status, a TLS problem, a connection cut mid-transfer).

    Looks through the exception's chain (httpx wraps httpcore wraps the socket error; urllib puts
    it in URLError.reason): a failed name lookup, a refused connection, an unreachable network or
    host, or a connection attempt that timed out."""
    import errno
    import socket

    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen or len(seen) > 20:
            continue
        seen.add(id(e))
        number = getattr(e, "errno", None)
        text = str(e).lower()
        if isinstance(e, socket.gaierror) or any(w in text for w in _DNS_WORDS):
            return f"{host} could not be looked up (no answer from DNS)"
        if isinstance(e, ConnectionRefusedError) or number == errno.ECONNREFUSED or "connection refused" in text:
            return f"{host} refused the connection"
        if number in (errno.ENETUNREACH, errno.ENETDOWN) or "network is unreachable" in text:
            return "the network is unreachable"
        if number in (errno.EHOSTUNREACH, errno.EHOSTDOWN) or "no route to host" in text:
            return f"there is no route to {host}"
        # httpx's connect timeout; urllib wraps only connect/send failures in URLError
        if type(e).__name__ == "ConnectTimeout" or (type(e).__name__ == "URLError"
                                                     and isinstance(getattr(e, "reason", None), TimeoutError)):
            return f"{host} did not answer (the connection timed out)"
        for nxt in (e.__cause__, e.__context__, getattr(e, "reason", None)):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return None
