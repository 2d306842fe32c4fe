"""Where the app's model comes from: a GGUF file (a `Path`) or an OpenAI-compatible server
(`ServerSource`, dgchat.remote). `ModelSession` (app/session.py) loads either through its one loader
and keys its state by the source; screens name a source with `display_name`/`short_path`
(app/paths.py), which know both.

A chat's own model (set in its settings) is always a file; a server is the session's default source
(`dgchat --server URL`, or `[server] url` in config.toml when no model is named).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from dgchat.remote.client import normalize_url

# tries after a failed connection or a 429/5xx (0.5, 1, 2 s apart); read when an engine connects
SERVER_RETRIES = 3


@dataclass(frozen=True)
class ServerSource:
    """A model served over HTTP: the server's URL (normalized: no trailing /v1) and its API key.
    `str()` is the URL alone (it is stored with answers and shown); the key is never shown."""

    url: str
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, url: str, api_key: str | None = None) -> ServerSource:
        """A source from what the user typed; raises InvalidParameterError for a URL that is not
        http(s)://host[:port]."""
        return cls(normalize_url(url), api_key or None)

    @property
    def host(self) -> str:
        """host:port, as status lines name the server."""
        return self.url.partition("://")[2].split("/", 1)[0]

    def __str__(self) -> str:
        return self.url


ModelSource: TypeAlias = Path | ServerSource


def as_source(value: ModelSource | str) -> ModelSource:
    """A source as the session keys it: a server as it is, anything else as a Path."""
    return value if isinstance(value, ServerSource) else Path(value)


def is_server(source: object) -> bool:
    return isinstance(source, ServerSource)

