"""What a file on the hub is, asked with huggingface_hub's own helpers (one HEAD request).

`resolve_remote()` builds the URL with `hf_hub_url` and reads `get_hf_file_metadata`: the commit
the revision points to (X-Repo-Commit), the etag (X-Linked-Etag for LFS files, which is the file's
sha256, else ETag) and the size (X-Linked-Size, else Content-Length). huggingface_hub errors are
turned into dgchat's one-line errors here, so nothing above this module sees an HTTP exception.

The endpoint: huggingface_hub 2.4.0 reads HF_ENDPOINT once, when it is imported
(`constants.ENDPOINT`); `hf_hub_url(endpoint=...)` and `HfApi(endpoint=...)` take one per call.
dgchat therefore reads HF_ENDPOINT itself at call time (`hub_endpoint()`) and passes it explicitly.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from dgchat.hub.errors import (
    DownloadError,
    HubError,
    NoNetworkError,
    NotFoundOnHubError,
    TokenRequiredError,
    no_network_reason,
)
from dgchat.hub.offline import hub_network

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
HEAD_TIMEOUT = 20.0


def hub_endpoint(endpoint: str | None = None) -> str:
    """The hub to talk to: the argument, else $HF_ENDPOINT now, else huggingface_hub's default."""
    if endpoint:
        return endpoint.rstrip("/")
    env = os.environ.get("HF_ENDPOINT")
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def effective_token(token: str | bool | None) -> str | None:
    """An explicit token; False for none; None: HF_TOKEN, else the token stored by the hub's login."""
    if token is False:
        return None
    if isinstance(token, str) and token.strip():
        return token.strip()
    from huggingface_hub import get_token

    return get_token()


@dataclass(frozen=True)
class RemoteFile:
    repo: str
    filename: str
    revision: str  # as asked ("main")
    commit: str  # what it resolved to
    etag: str
    size: int | None
    sha256: str | None  # the LFS etag when it is a sha256 (git-stored files have a sha1 etag)
    url: str  # resolve URL pinned to `commit`: the bytes cannot change under a resumed download
    endpoint: str
    git_sha1: str | None = None  # a git-stored file's ETag: sha1 of b"blob <size>\0" + content


def describe_hub_error(exc: BaseException, repo: str, filename: str, revision: str, had_token: bool,
                       endpoint: str = "") -> HubError:
    """A huggingface_hub / httpx2 exception as a dgchat one-liner."""
    import httpx2
    from huggingface_hub import errors as hf

    where = f"{repo}/{filename}"
    host = urlsplit(endpoint).hostname or endpoint or "the hub"
    offline = no_network_reason(exc, host)
    if offline is not None and not isinstance(exc, hf.HfHubHTTPError):
        return NoNetworkError(f"no network connection: {offline}; nothing was downloaded", reason=offline)
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, hf.GatedRepoError):
        if had_token and status == 403:
            return TokenRequiredError(
                f"{repo} is gated and your Hugging Face token has no access to it: accept the licence on the "
                f"model's page, then pull again", repo=repo, had_token=True)
        return TokenRequiredError(
            f"{repo} is gated: it needs a Hugging Face access token (store one with `dgchat models login`, "
            f"or set HF_TOKEN), after accepting the licence on the model's page", repo=repo, had_token=had_token)
    if isinstance(exc, hf.RevisionNotFoundError):
        return NotFoundOnHubError(f"{repo} has no revision {revision!r} (HTTP 404)")
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return NotFoundOnHubError(f"no file {filename!r} in {repo} at {revision} (HTTP 404)")
    if isinstance(exc, hf.RepositoryNotFoundError):
        if status == 401 and not had_token:
            return TokenRequiredError(
                f"{repo}: the hub refused access without a token (HTTP 401): the repo is private or gated, or "
                f"does not exist; if you have access, store a token with `dgchat models login`",
                repo=repo, had_token=False)
        return NotFoundOnHubError(f"no repository {repo} on the hub (or your token cannot see it)")
    if isinstance(exc, hf.HfHubHTTPError):
        if status in (401, 403):
            return TokenRequiredError(
                f"{where}: the hub refused access (HTTP {status}); "
                + ("your token has no access to this repo" if had_token else
                   "store a Hugging Face token with `dgchat models login`"), repo=repo, had_token=had_token)
        if status == 404:
            return NotFoundOnHubError(f"no file {filename!r} in {repo} at {revision} (HTTP 404)")
        return DownloadError(f"{where}: the hub answered HTTP {status}; try again later")
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return DownloadError(f"{where}: offline mode is on (HF_HUB_OFFLINE); nothing was downloaded")
    if isinstance(exc, hf.FileMetadataError):
        return DownloadError(f"{where}: the server is not a Hugging Face hub endpoint ({str(exc).splitlines()[0]})")
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return DownloadError(f"cannot reach the hub for {where}: {exc}".splitlines()[0])
    return DownloadError(f"{where}: {exc}".splitlines()[0])


def resolve_remote(repo: str, filename: str, *, revision: str = "main", token: str | bool | None = None,
                   endpoint: str | None = None, timeout: float = HEAD_TIMEOUT) -> RemoteFile:
    """One HEAD request through huggingface_hub (allowed even in offline mode: the user asked for it)."""
    import httpx2
    from huggingface_hub import errors as hf
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    base = hub_endpoint(endpoint)
    tok = effective_token(token)
    url = hf_hub_url(repo, filename, revision=revision, endpoint=base)
    try:
        with hub_network():
            meta = get_hf_file_metadata(url, token=tok if tok is not None else False, timeout=timeout,
                                        endpoint=base)
    except (hf.HfHubHTTPError, hf.OfflineModeIsEnabled, httpx2.TransportError, OSError) as exc:
        raise describe_hub_error(exc, repo, filename, revision, tok is not None, base) from None
    if not meta.commit_hash:
        raise DownloadError(f"{base} did not say which commit {repo}@{revision} is (no X-Repo-Commit header); "
                            "is HF_ENDPOINT a Hugging Face hub?")
    if not meta.etag:
        raise DownloadError(f"{base} sent no ETag for {repo}/{filename}; cannot download it reliably")
    etag = meta.etag.lower().removeprefix("w/").strip('"')
    return RemoteFile(
        repo=repo, filename=filename, revision=revision, commit=meta.commit_hash, etag=meta.etag,
        size=meta.size, sha256=etag if _SHA256.match(etag) else None,
        url=hf_hub_url(repo, filename, revision=meta.commit_hash, endpoint=base), endpoint=base,
        git_sha1=etag if _SHA1.match(etag) else None,
    )
