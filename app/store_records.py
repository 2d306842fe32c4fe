"""The saved-chat store's records and errors: what `Store` returns (Chat, Message, Recording,
SearchHit), what it raises, and how text and JSON columns are made safe to store and read.

Apart from app/store.py so that the schema and search modules beside it can share them without
importing the store itself; `from dgchat.app.store import ...` keeps working for every name here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from dgchat.model_backend.errors import DgchatError

DEFAULT_TITLE = "New chat"
STATUSES = ("done", "generating", "stopped", "error")
HIGHLIGHT_START = "\x02"  # search snippets mark matches with these; the UI turns them into styles
HIGHLIGHT_END = "\x03"
SURROGATE = re.compile("[\ud800-\udfff]")


class StoreError(DgchatError):
    """The chat database cannot be opened or is from a newer dgchat."""


class SearchError(StoreError):
    """The search text cannot be searched for (too long); the message says why."""


def storable(text: str) -> str:
    """`text` as SQLite can store it: lone surrogates (from a paste or a file with bad UTF-8) become U+FFFD."""
    return SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


def json_dict(text: Any) -> dict[str, Any]:
    """A JSON object column; corrupt or non-object JSON reads as {} (one bad row must not stop the store)."""
    try:
        value = json.loads(text or "{}")
    except (TypeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class Chat:
    id: int
    title: str
    model: str | None
    system_prompt: str
    params: dict[str, Any]
    created_at: float
    updated_at: float


@dataclass
class Message:
    id: int
    chat_id: int
    role: str
    content: str
    status: str = "done"
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    parent_id: int | None = None  # the message before this one (None: the chat's first)
    version: int = 1  # which version of its turn this is (1-based, oldest first) ...
    versions: int = 1  # ... of how many (regenerated answers, edited prompts)


@dataclass
class Recording:
    """An answer's stored denoising history: `data` None when it was dropped (the chat's bound)."""

    message_id: int
    data: bytes | None
    size: int


@dataclass
class SearchHit:
    chat_id: int
    chat_title: str
    message_id: int | None  # None: the chat's title matched
    role: str
    snippet: str  # matches wrapped in HIGHLIGHT_START / HIGHLIGHT_END
    # the turn's versions in which this text matched (1-based, oldest first) and how many the turn
    # has: versions of one answer that match with the same words are one hit, naming them all
    matched_versions: tuple[int, ...] = (1,)
    versions: int = 1

    def versions_text(self) -> str:
        """'' for a turn with one version; 'version 2/4'; 'versions 1, 3 of 4'."""
        if self.versions <= 1:
            return ""
        if len(self.matched_versions) == 1:
            return f"version {self.matched_versions[0]}/{self.versions}"
        return f"versions {', '.join(map(str, self.matched_versions))} of {self.versions}"
