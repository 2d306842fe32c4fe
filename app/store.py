"""Saved chats: one SQLite file under the platformdirs data dir.

Schema (PRAGMA user_version is the schema version; `_STEPS[i]` upgrades version i to i + 1):

    chats(id, title, model, system_prompt, params, created_at, updated_at)
        model NULL = the app's default model; params = JSON sampler overrides (unset = model default)
    messages(id, chat_id -> chats ON DELETE CASCADE, role 'user'|'assistant', content,
             status 'done'|'generating'|'stopped'|'error', meta JSON, created_at,
             parent_id, shown)
        meta holds model, stop reason, statistics, parameters
        versions: the messages of a chat form a tree. parent_id is the message before this one
        (NULL: the first); messages with the same parent are versions of one turn (regenerated
        answers, edited prompts), in id order, and `shown` = 1 marks the one the conversation
        uses. The conversation is the path from the first message down through shown versions.
    settings(key, value JSON)                  app state: last theme, last chat
    recordings(message_id -> messages ON DELETE CASCADE, chat_id -> chats ON DELETE CASCADE,
               data BLOB, size, created_at)
        an answer's denoising history (dgchat.recording.history, for replay and .cast export);
        data NULL: dropped to keep the chat's recordings under MAX_RECORDINGS_BYTES_PER_CHAT
        (the newest are kept). An answer without a row was never recorded (before schema 4).
    messages_fts                               FTS5 index over messages.content (external content,
                                               kept in sync by triggers)

Crash safety: WAL with synchronous=FULL; a user message is committed before generation starts; an
answer is inserted as 'generating' and its decided text checkpointed while it runs; on the next
open, answers left 'generating' by a process that is gone become 'stopped' with that text.

Thread-safe: one connection guarded by a lock, so a generation worker can finish its answer row
even when the UI is already shutting down.

Private: the database and its -wal/-shm files are created 0600 (SQLite gives the journal files the
database's mode) and an existing looser file is tightened; the folder dgchat makes for it is 0700.
Hostile text: every string is made storable (a lone surrogate, which SQLite cannot encode, becomes
U+FFFD), search text is cleaned and bounded before it reaches FTS5, and a row whose JSON is corrupt
reads as empty settings instead of stopping the store from opening.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat.model_backend.errors import DgchatError

DEFAULT_TITLE = "New chat"
STATUSES = ("done", "generating", "stopped", "error")
HIGHLIGHT_START = "\x02"  # search snippets mark matches with these; the UI turns them into styles
HIGHLIGHT_END = "\x03"


MAX_RECORDINGS_BYTES_PER_CHAT = 8 << 20  # a chat keeps its newest recordings up to this many bytes
MAX_SEARCH_CHARS = 500  # a search is a few words; FTS5 query cost grows with the terms
MAX_SEARCH_WORDS = 32
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_WORD = re.compile(r"[^\W_]+")  # letters and digits: what FTS5's unicode61 tokenizer keeps as a word


class StoreError(DgchatError):
    """The chat database cannot be opened or is from a newer dgchat."""


class SearchError(StoreError):
    """The search text cannot be searched for (too long); the message says why."""


def storable(text: str) -> str:
    """`text` as SQLite can store it: lone surrogates (from a paste or a file with bad UTF-8) become U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


def _json_dict(text: Any) -> dict[str, Any]:
    """A JSON object column; corrupt or non-object JSON reads as {} (one bad row must not stop the store)."""
    try:
        value = json.loads(text or "{}")
    except (TypeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _private_file(path: Path) -> None:
    """Create the database file 0600 before SQLite opens it (its -wal/-shm then get the same mode),
    or tighten an existing one and its journal files."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if p.exists() and stat.S_IMODE(p.stat().st_mode) & 0o077:
                os.chmod(p, 0o600)
    except OSError:
        pass  # a read-only or foreign file: SQLite's own error says what is wrong


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


# -- schema upgrade steps ---------------------------------------------------------------------------
def _step_1(db: sqlite3.Connection) -> None:
    """Chats, messages, settings."""
    db.execute(
        """CREATE TABLE chats(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL DEFAULT 'New chat',
            model TEXT,
            system_prompt TEXT NOT NULL DEFAULT '',
            params TEXT NOT NULL DEFAULT '{}',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL)"""
    )
    db.execute(
        """CREATE TABLE messages(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'done' CHECK (status IN ('done', 'generating', 'stopped', 'error')),
            created_at REAL NOT NULL)"""
    )
    db.execute("CREATE INDEX messages_by_chat ON messages(chat_id, id)")
    db.execute("CREATE TABLE settings(key TEXT PRIMARY KEY, value TEXT NOT NULL)")


def _step_2(db: sqlite3.Connection) -> None:
    """Per-message metadata, and full-text search over messages (existing rows indexed)."""
    db.execute("ALTER TABLE messages ADD COLUMN meta TEXT NOT NULL DEFAULT '{}'")
    db.execute(
        "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id', "
        "tokenize='unicode61 remove_diacritics 2')"
    )
    db.execute(
        "CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN "
        "INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END"
    )
    db.execute(
        "CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN "
        "INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content); END"
    )
    db.execute(
        "CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN "
        "INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content); "
        "INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END"
    )
    db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")


def _step_3(db: sqlite3.Connection) -> None:
    """Versions of a turn: each message points at the one before it (parent_id) and `shown` marks
    the version the conversation uses. Existing chats become a chain in id order, all shown.

    parent_id has no REFERENCES clause on purpose: a self-referencing ON DELETE CASCADE would
    recurse once per message of a long chat (SQLite stops at 1,000 levels); the store deletes a
    branch itself (Store.delete_message)."""
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER")
    db.execute("ALTER TABLE messages ADD COLUMN shown INTEGER NOT NULL DEFAULT 1")
    db.execute(
        "UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p "
        "WHERE p.chat_id = messages.chat_id AND p.id < messages.id)"
    )
    db.execute("CREATE INDEX messages_by_parent ON messages(chat_id, parent_id, id)")


def _step_4(db: sqlite3.Connection) -> None:
    """Denoising recordings of answers, in their own table so that reading a conversation never
    reads them. Older answers have none (their replay says so)."""
    db.execute(
        """CREATE TABLE recordings(
            message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            data BLOB,
            size INTEGER NOT NULL,
            created_at REAL NOT NULL)"""
    )
    db.execute("CREATE INDEX recordings_by_chat ON recordings(chat_id, message_id)")


_STEPS: list[Callable[[sqlite3.Connection], None]] = [_step_1, _step_2, _step_3, _step_4]
SCHEMA_VERSION = len(_STEPS)


def clean_search(text: str) -> str:
    """Search text without NULs, control characters or lone surrogates (FTS5 reads a NUL as the end
    of the query; SQLite cannot encode a surrogate)."""
    return _CONTROL.sub(" ", _SURROGATE.sub("", text))


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


def _pid_of(meta: dict[str, Any]) -> int:
    pid = meta.get("pid", 0)
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else 0


def _pid_alive(pid: int) -> bool:
    if pid <= 0 or pid >= 1 << 31:  # os.kill raises OverflowError beyond a C int
        return False
    if pid == os.getpid():
        return True  # another Store in this very process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class Store:
    def __init__(self, path: str | Path, *, upgrade_to: int | None = None) -> None:
        self.path = Path(path)
        try:
            if not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, mode=0o700)
            _private_file(self.path)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the chat database {self.path}: {exc}") from None
        self._lock = threading.RLock()
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate(SCHEMA_VERSION if upgrade_to is None else upgrade_to)
            if self.schema_version >= 2:
                self.recover_interrupted()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"{self.path} is not a usable chat database: {exc}") from None

    # -- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self, target: int) -> None:
        current = self.schema_version
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer dgchat (schema {current}; this one knows {SCHEMA_VERSION}); "
                f"upgrade dgchat to open it"
            )
        for version in range(current, target):
            with self._tx() as db:
                _STEPS[version](db)
                db.execute(f"PRAGMA user_version = {version + 1}")

    def integrity_ok(self) -> bool:
        return self._query("PRAGMA integrity_check")[0][0] == "ok"

    def recover_interrupted(self) -> int:
        """Answers left 'generating' by a process that died become 'stopped'; returns how many."""
        rows = self._query("SELECT id, meta FROM messages WHERE status = 'generating'")
        dead = [r["id"] for r in rows if not _pid_alive(_pid_of(_json_dict(r["meta"])))]
        if dead:
            with self._tx() as db:
                for message_id in dead:
                    meta = _json_dict(db.execute("SELECT meta FROM messages WHERE id = ?", (message_id,)).fetchone()[0])
                    meta.pop("pid", None)
                    meta["stop_reason"] = "interrupted"
                    db.execute(
                        "UPDATE messages SET status = 'stopped', meta = ? WHERE id = ?", (json.dumps(meta), message_id)
                    )
        return len(dead)

    # -- chats ----------------------------------------------------------------------------------
    @staticmethod
    def _chat(row: sqlite3.Row) -> Chat:
        return Chat(
            id=row["id"], title=row["title"], model=row["model"], system_prompt=row["system_prompt"],
            params=_json_dict(row["params"]), created_at=row["created_at"], updated_at=row["updated_at"],
        )

    def create_chat(
        self, title: str = DEFAULT_TITLE, *, model: str | None = None, system_prompt: str = "",
        params: dict[str, Any] | None = None,
    ) -> Chat:
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO chats(title, model, system_prompt, params, created_at, updated_at) VALUES (?,?,?,?,?,?)",
                (storable(title), model, storable(system_prompt), json.dumps(params or {}), now, now),
            )
            chat_id = int(cur.lastrowid)
        chat = self.get_chat(chat_id)
        assert chat is not None
        return chat

    def get_chat(self, chat_id: int) -> Chat | None:
        rows = self._query("SELECT * FROM chats WHERE id = ?", (chat_id,))
        return self._chat(rows[0]) if rows else None

    def list_chats(self) -> list[Chat]:
        return [self._chat(r) for r in self._query("SELECT * FROM chats ORDER BY updated_at DESC, id DESC")]

    def rename_chat(self, chat_id: int, title: str) -> None:
        title = storable(" ".join(title.split())) or DEFAULT_TITLE
        with self._tx() as db:
            db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    def update_chat_settings(
        self, chat_id: int, *, model: str | None, system_prompt: str, params: dict[str, Any]
    ) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE chats SET model = ?, system_prompt = ?, params = ? WHERE id = ?",
                (model or None, storable(system_prompt), json.dumps(params), chat_id),
            )

    # -- messages -------------------------------------------------------------------------------
    @staticmethod
    def _message(row: sqlite3.Row, version: int = 1, versions: int = 1) -> Message:
        return Message(
            id=row["id"], chat_id=row["chat_id"], role=row["role"], content=row["content"], status=row["status"],
            meta=_json_dict(row["meta"]), created_at=row["created_at"], parent_id=row["parent_id"],
            version=version, versions=versions,
        )

    @staticmethod
    def _conversation(db: sqlite3.Connection, chat_id: int) -> list[tuple[sqlite3.Row, int, int]]:
        """The chat's conversation: from its first message down through the shown version of each
        turn, as (row, version, of how many versions)."""
        turns: dict[int | None, list[sqlite3.Row]] = {}
        for row in db.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,)):
            turns.setdefault(row["parent_id"], []).append(row)
        path: list[tuple[sqlite3.Row, int, int]] = []
        parent: int | None = None
        while versions := turns.pop(parent, None):  # pop: a corrupt parent loop cannot spin
            shown = [i for i, row in enumerate(versions) if row["shown"]]
            index = shown[-1] if shown else len(versions) - 1  # none marked: the newest
            row = versions[index]
            path.append((row, index + 1, len(versions)))
            parent = row["id"]
        return path

    @staticmethod
    def _turn(db: sqlite3.Connection, chat_id: int, parent_id: int | None) -> list[sqlite3.Row]:
        """The versions of one turn (the messages after `parent_id`), oldest first."""
        return db.execute(
            "SELECT * FROM messages WHERE chat_id = ? AND parent_id IS ? ORDER BY id", (chat_id, parent_id)
        ).fetchall()

    def messages(self, chat_id: int) -> list[Message]:
        """The conversation as the model and the export see it: each turn's shown version, in order."""
        with self._lock:
            return [self._message(*entry) for entry in self._conversation(self._db, chat_id)]

    def get_message(self, message_id: int) -> Message | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return None
            ids = [r["id"] for r in self._turn(self._db, row["chat_id"], row["parent_id"])]
        return self._message(row, ids.index(row["id"]) + 1, len(ids))

    def versions(self, message_id: int) -> list[Message]:
        """Every version of the message's turn, itself included, oldest first ([] if it is gone)."""
        with self._lock:
            row = self._db.execute("SELECT chat_id, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            rows = self._turn(self._db, row["chat_id"], row["parent_id"]) if row is not None else []
        return [self._message(r, i + 1, len(rows)) for i, r in enumerate(rows)]

    def show_version(self, message_id: int) -> None:
        """Make the message the version of its turn that the conversation uses, and each message
        before it the shown version of its own turn (a search hit in an older version shows it)."""
        with self._tx() as db:
            current: int | None = message_id
            seen: set[int] = set()
            while current is not None and current not in seen:
                seen.add(current)
                row = db.execute("SELECT chat_id, parent_id FROM messages WHERE id = ?", (current,)).fetchone()
                if row is None:
                    break
                db.execute(
                    "UPDATE messages SET shown = (id = ?) WHERE chat_id = ? AND parent_id IS ?",
                    (current, row["chat_id"], row["parent_id"]),
                )
                current = row["parent_id"]

    def add_message(
        self, chat_id: int, role: str, content: str, *, status: str = "done", meta: dict[str, Any] | None = None,
        version_of: int | None = None,
    ) -> Message:
        """Insert and commit a message (durable when this returns) at the end of the conversation,
        or, with `version_of`, as a new version of that message's turn: shown instead of it, while
        the old version and everything after it are kept (flip back to see them). The first user
        message titles the chat."""
        now = time.time()
        content = storable(content)
        with self._tx() as db:
            if version_of is None:
                path = self._conversation(db, chat_id)
                parent = path[-1][0]["id"] if path else None
            else:
                row = db.execute("SELECT chat_id, parent_id FROM messages WHERE id = ?", (version_of,)).fetchone()
                if row is None or row["chat_id"] != chat_id:
                    raise StoreError(f"message {version_of} is not in chat {chat_id} (deleted meanwhile?)")
                parent = row["parent_id"]
            db.execute("UPDATE messages SET shown = 0 WHERE chat_id = ? AND parent_id IS ?", (chat_id, parent))
            cur = db.execute(
                "INSERT INTO messages(chat_id, role, content, status, meta, created_at, parent_id, shown) "
                "VALUES (?,?,?,?,?,?,?,1)",
                (chat_id, role, content, status, json.dumps(meta or {}), now, parent),
            )
            db.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
            if role == "user":
                db.execute("UPDATE chats SET title = ? WHERE id = ? AND title = ?", (_title_from(content), chat_id, DEFAULT_TITLE))
            message_id = int(cur.lastrowid)
        message = self.get_message(message_id)
        assert message is not None
        return message

    def begin_answer(self, chat_id: int, meta: dict[str, Any] | None = None, *, version_of: int | None = None) -> Message:
        """An empty assistant row, 'generating', owned by this process until finished; with
        `version_of`, a new version of that answer (regenerate)."""
        meta = dict(meta or {})
        meta["pid"] = os.getpid()
        return self.add_message(chat_id, "assistant", "", status="generating", meta=meta, version_of=version_of)

    def checkpoint_answer(self, message_id: int, content: str) -> None:
        content = storable(content)
        with self._tx() as db:
            db.execute("UPDATE messages SET content = ? WHERE id = ? AND status = 'generating'", (content, message_id))

    def finish_answer(self, message_id: int, content: str, status: str, meta: dict[str, Any] | None = None,
                      *, recording: bytes | None = None) -> None:
        """Save an answer's final text, status and metadata, with its denoising recording (one
        transaction: an answer is never kept with half a recording)."""
        if status not in STATUSES:
            raise ValueError(f"bad message status {status!r}")
        content = storable(content)
        with self._tx() as db:
            row = db.execute("SELECT meta, chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return  # the chat was deleted meanwhile
            merged = _json_dict(row["meta"])
            merged.pop("pid", None)
            merged.update(meta or {})
            db.execute(
                "UPDATE messages SET content = ?, status = ?, meta = ? WHERE id = ?",
                (content, status, json.dumps(merged), message_id),
            )
            db.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (time.time(), row["chat_id"]))
            if recording is not None:
                self._put_recording(db, message_id, row["chat_id"], recording)

    # -- recordings -----------------------------------------------------------------------------
    @staticmethod
    def _put_recording(db: sqlite3.Connection, message_id: int, chat_id: int, data: bytes) -> None:
        """Store a recording; then drop the chat's oldest ones (their data, the row stays to say so)
        while the chat's recordings take more than MAX_RECORDINGS_BYTES_PER_CHAT."""
        db.execute(
            "INSERT INTO recordings(message_id, chat_id, data, size, created_at) VALUES (?,?,?,?,?) "
            "ON CONFLICT(message_id) DO UPDATE SET data = excluded.data, size = excluded.size",
            (message_id, chat_id, sqlite3.Binary(data), len(data), time.time()),
        )
        rows = db.execute(
            "SELECT message_id, size FROM recordings WHERE chat_id = ? AND data IS NOT NULL ORDER BY message_id DESC",
            (chat_id,),
        ).fetchall()
        total = 0
        for row in rows:
            total += row["size"]
            if total > MAX_RECORDINGS_BYTES_PER_CHAT:
                db.execute("UPDATE recordings SET data = NULL WHERE message_id = ?", (row["message_id"],))

    def save_recording(self, message_id: int, data: bytes) -> None:
        with self._tx() as db:
            row = db.execute("SELECT chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is not None:
                self._put_recording(db, message_id, row["chat_id"], data)

    def recording(self, message_id: int) -> Recording | None:
        """The answer's recording; None when it never had one (an answer from before recordings)."""
        rows = self._query("SELECT message_id, data, size FROM recordings WHERE message_id = ?", (message_id,))
        if not rows:
            return None
        data = rows[0]["data"]
        return Recording(rows[0]["message_id"], bytes(data) if data is not None else None, rows[0]["size"])

    def recordings_size(self, chat_id: int) -> int:
        rows = self._query("SELECT COALESCE(SUM(size), 0) FROM recordings WHERE chat_id = ? AND data IS NOT NULL",
                           (chat_id,))
        return int(rows[0][0])

    def update_message(self, message_id: int, content: str) -> None:
        content = storable(content)
        with self._tx() as db:
            db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))

    def delete_message(self, message_id: int) -> None:
        """Delete a message and what follows it in its branch; when it was the shown version of its
        turn, the newest remaining version is shown instead."""
        with self._tx() as db:
            row = db.execute("SELECT chat_id, parent_id, shown FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return
            doomed = [message_id, *self._after(db, row["chat_id"], message_id)]
            db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in doomed])
            if row["shown"]:
                db.execute(
                    "UPDATE messages SET shown = 1 WHERE id = "
                    "(SELECT MAX(id) FROM messages WHERE chat_id = ? AND parent_id IS ?)",
                    (row["chat_id"], row["parent_id"]),
                )

    def delete_after(self, chat_id: int, message_id: int) -> int:
        """Delete what follows `message_id` in its branch (every version after it); returns how many."""
        with self._tx() as db:
            doomed = self._after(db, chat_id, message_id)
            db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in doomed])
            return len(doomed)

    @staticmethod
    def _after(db: sqlite3.Connection, chat_id: int, message_id: int) -> list[int]:
        """Ids of the messages below `message_id` in the chat's tree (all versions, all depths)."""
        children: dict[int | None, list[int]] = {}
        for row in db.execute("SELECT id, parent_id FROM messages WHERE chat_id = ?", (chat_id,)):
            children.setdefault(row["parent_id"], []).append(row["id"])
        found: list[int] = []
        seen = {message_id}
        stack = [message_id]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    stack.append(child)
        return found

    def prompt_history(self, limit: int = 500) -> list[str]:
        """Earlier prompts, newest first, without repeats (Up in the prompt box)."""
        rows = self._query(
            "SELECT content FROM messages WHERE role = 'user' GROUP BY content ORDER BY MAX(id) DESC LIMIT ?", (limit,)
        )
        return [r["content"] for r in rows]

    # -- search ---------------------------------------------------------------------------------
    def search(self, text: str, limit: int = 50) -> list[SearchHit]:
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
                for row in self._query("SELECT id, title FROM chats ORDER BY updated_at DESC"):
                    title = fold(row["title"])
                    if all(w in title for w in words):
                        hits.append(SearchHit(row["id"], row["title"], None, "title", row["title"]))
                        if len(hits) >= limit:
                            break
            rows = self._query(
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

    # -- settings -------------------------------------------------------------------------------
    def get_setting(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT value FROM settings WHERE key = ?", (key,))
        if not rows:
            return default
        try:
            return json.loads(rows[0]["value"])
        except (TypeError, ValueError, RecursionError):
            return default  # a corrupt setting is as good as none

    def set_setting(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )


def _title_from(content: str) -> str:
    line = " ".join(_CONTROL.sub(" ", content).split())
    if not line:
        return DEFAULT_TITLE
    return line if len(line) <= 40 else line[:39].rstrip() + "…"
