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
