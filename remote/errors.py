"""What can go wrong talking to a remote engine, each as one clear line for the user.

Every error is a DgchatError, so `dgchat generate|npc --server` print it as `dgchat: error: ...`
(exit code 2) and the app's error_text shows its message as is.
"""

from __future__ import annotations

from dgchat.model_backend.errors import DgchatError


class RemoteError(DgchatError):
    """A remote call failed. `retryable`: another try (here or on another server) may succeed."""

    retryable = False

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class ServerUnreachable(RemoteError):
    """No connection: refused, unknown host, network down, or the connection broke before an answer."""

    retryable = True


class RemoteTimeout(RemoteError):
    """The server accepted the request but did not answer (or stopped streaming) in time."""

    retryable = True


class AuthRejected(RemoteError):
    """401/403: a missing or wrong API key. Retrying cannot help."""


class NoInfillEndpoint(RemoteError):
    """The server has no /v1/infill (it is not a dgchat server): templates and NPC lines need one."""


class StreamBroken(RemoteError):
    """The connection broke after the answer had started streaming: what arrived is kept, the rest
    is lost. Not retried by the client (the caller has already shown part of the answer)."""

    retryable = True


class RemoteApiError(RemoteError):
    """The server answered with an error status (or an error event in a stream)."""

    def __init__(self, message: str, *, url: str = "", status: int = 0, code: str | int | None = None,
                 param: str | None = None) -> None:
        super().__init__(message, url=url)
        self.status = status
        self.code = code
        self.param = param
        # 429 (busy) and 5xx (overloaded, restarting, shutting down) are worth another try
        self.retryable = status == 429 or status >= 500
