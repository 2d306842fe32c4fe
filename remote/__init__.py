"""Remote engines: dgchat on an OpenAI-compatible server (vLLM, another machine's `dgchat serve`).

- `RemoteClient` (client.py): one server's HTTP calls, retries with backoff, clear errors.
- `RemoteEngine` (engine.py): the server standing in for a loaded model (the app's Engine Protocol),
  with the live canvas when the server is `dgchat serve`; its text and vocabulary methods and
  `RemotePrompt` are in vocabulary.py, its request bodies are built in request_body.py.
- `ServerPool` (pool.py): NPC line batches spread over several `dgchat serve` servers.

Nothing here runs unless the user names a server (`--server URL`, `[server] url`): dgchat stays
offline by default (docs/SCALING.md).
"""

from __future__ import annotations

from dgchat.remote.client import API_KEY_ENV, RemoteClient, normalize_url
from dgchat.remote.engine import RemoteEngine
from dgchat.remote.errors import (
    AuthRejected,
    NoInfillEndpoint,
    RemoteApiError,
    RemoteError,
    RemoteTimeout,
    ServerUnreachable,
    StreamBroken,
)
from dgchat.remote.vocabulary import RemotePrompt

__all__ = [
    "API_KEY_ENV",
    "AuthRejected",
    "NoInfillEndpoint",
    "RemoteApiError",
    "RemoteClient",
    "RemoteEngine",
    "RemoteError",
    "RemotePrompt",
    "RemoteTimeout",
    "ServerUnreachable",
    "StreamBroken",
    "normalize_url",
]
