"""Search over saved chats: search text cleaned and bounded before it reaches FTS5, words folded
as FTS5's unicode61 tokenizer folds them, and the search itself (titles and messages, versions
of one turn that match with the same words folded into one hit).

Apart from app/store.py so that the store holds the storing; `Store.search` runs `search_saved`
on its connection, and `from dgchat.app.store import fts_query, ...` keeps working.
"""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from collections.abc import Callable

from dgchat.app.store_records import (
    HIGHLIGHT_END,
    HIGHLIGHT_START,
    SURROGATE,
    SearchError,
    SearchHit,
)

MAX_SEARCH_CHARS = 500  # a search is a few words; FTS5 query cost grows with the terms
MAX_SEARCH_WORDS = 32
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_WORD = re.compile(r"[^\W_]+")  # letters and digits: what FTS5's unicode61 tokenizer keeps as a word

Query = Callable[..., list[sqlite3.Row]]  # runs (sql, args) under the store's lock


def clean_search(text: str) -> str:
    """Search text without NULs, control characters or lone surrogates (FTS5 reads a NUL as the end
    of the query; SQLite cannot encode a surrogate)."""
    return CONTROL.sub(" ", SURROGATE.sub("", text))


def fts_query(text: str) -> str | None:
    """User text -> an FTS5 query: every word must match, as a prefix; FTS syntax is not exposed
    (each word is a quoted string; a quote in it is a separator, like any other punctuation, so
    `sir"king` is two words, not "sirking")."""
    words = [w.replace('"', " ").strip() for w in clean_search(text).split()]
    words = [w for w in words if w][:MAX_SEARCH_WORDS]
    if not words:
        return None
    return " ".join(f'"{w}"*' for w in words)


def fold(text: str) -> str:
    """Text as search compares it: case folded and diacritics removed (FTS5's unicode61 tokenizer
    with remove_diacritics does the same to messages), so café, CAFE and cafe are one word."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def search_words(text: str) -> list[str]:
    """The words of a search, folded; punctuation separates words and is never part of one."""
    return _WORD.findall(fold(clean_search(text)))[:MAX_SEARCH_WORDS]


def search_saved(run_sql: Query, text: str, limit: int = 50) -> list[SearchHit]:
    """Chats whose title contains every word of the text and messages containing every word (as
    prefixes), both ignoring case, diacritics and punctuation. Raises SearchError (one line) for
    text that cannot be a search; never a raw SQLite error."""
    text = clean_search(text)
    if len(text) > MAX_SEARCH_CHARS:
        raise SearchError(f"search text is too long ({len(text):,} characters; at most {MAX_SEARCH_CHARS})")
    query = fts_query(text)
    if query is None:
        return []
    hits: list[SearchHit] = []
    # titles word by word, as the messages are: a title LIKE '%text%' on the whole text kept the
    # punctuation, and `sir"` found no title "Good sir" that `sir` found
    words = search_words(text)
    try:
        if words:
            for row in run_sql("SELECT id, title FROM chats ORDER BY updated_at DESC"):
                title = fold(row["title"])
                if all(w in title for w in words):
                    hits.append(SearchHit(row["id"], row["title"], None, "title", row["title"]))
                    if len(hits) >= limit:
                        break
        rows = run_sql(
            f"SELECT m.id, m.chat_id, m.role, m.parent_id, c.title, "
            f"snippet(messages_fts, 0, '{HIGHLIGHT_START}', '{HIGHLIGHT_END}', '…', 10) AS snip, "
            f"(SELECT COUNT(*) FROM messages v WHERE v.chat_id = m.chat_id AND v.parent_id IS m.parent_id "
            f" AND v.id <= m.id) AS version, "
            f"(SELECT COUNT(*) FROM messages v WHERE v.chat_id = m.chat_id AND v.parent_id IS m.parent_id) "
            f" AS versions "
            f"FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid JOIN chats c ON c.id = m.chat_id "
            f"WHERE messages_fts MATCH ? ORDER BY rank LIMIT ?",
            (query, limit * 4),  # room for versions that fold into one hit
        )
    except sqlite3.Error as exc:
        raise SearchError(f"search failed: {exc}") from None
    same: dict[tuple[int, int | None, str, str], SearchHit] = {}
    for row in rows:
        snippet = " ".join(row["snip"].split())
        key = (row["chat_id"], row["parent_id"], row["role"], snippet)
        if key in same:  # another version of the same turn, matching with the same words
            hit = same[key]
            hit.matched_versions = tuple(sorted({*hit.matched_versions, int(row["version"])}))
            continue
        hit = SearchHit(row["chat_id"], row["title"], row["id"], row["role"], snippet,
                        (int(row["version"]),), int(row["versions"]))
        same[key] = hit
        hits.append(hit)
    return hits[:limit]
