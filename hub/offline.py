"""Offline by default: dgchat makes no network call unless the user asks for a download.

`enforce_offline()` runs first thing in `dgchat.cli.main` (so for the app too): it sets
HF_HUB_OFFLINE=1 for this process, which makes every huggingface_hub HTTP call raise
`OfflineModeIsEnabled` (huggingface_hub 2.4.0 checks `constants.HF_HUB_OFFLINE` in the request hook
of its shared httpx2 client; the constant is read from the environment at import, so an
already-imported module is updated as well). Anything in dgchat, or in a library it calls, that
tries to reach the hub at run time therefore fails loudly instead of leaking a request.

`hub_network()` lifts the flag for the duration of one explicit user action (resolving a file
before a download, validating a token). It is reference-counted so concurrent downloads work, and
it restores offline mode when the last one ends. dgchat's own transfer (dgchat.hub.download) does
not go through huggingface_hub's client; it only ever runs inside a user-requested pull.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_saved: bool | None = None


def enforce_offline() -> None:
    """HF_HUB_OFFLINE=1 for this process and for huggingface_hub if it is already imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        with _lock:
            if _depth == 0:
                constants.HF_HUB_OFFLINE = True


def is_offline() -> bool:
    """Whether huggingface_hub would refuse a request right now."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


@contextmanager
def hub_network() -> Iterator[None]:
    """Allow huggingface_hub requests inside the block (an explicit download or token check)."""
    global _depth, _saved
    from huggingface_hub import constants

    with _lock:
        if _depth == 0:
            _saved = bool(constants.HF_HUB_OFFLINE)
            constants.HF_HUB_OFFLINE = False
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                constants.HF_HUB_OFFLINE = bool(_saved)
                _saved = None
