"""Saved chats: one SQLite file under the platformdirs data dir.

Schema (PRAGMA user_version is the schema version; app/store_schema.py's `STEPS[i]` upgrades
version i to i + 1):

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

The records and errors live in app/store_records.py, the schema steps in app/store_schema.py and
search in app/store_search.py; their names are imported here so `from dgchat.app.store import ...`
keeps working.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dgchat.app.store_records import (
    DEFAULT_TITLE,
    HIGHLIGHT_END,
    HIGHLIGHT_START,
    STATUSES,
    Chat,
    Message,
    Recording,
    SearchError,
    SearchHit,
    StoreError,
    json_dict,
    storable,
)
from dgchat.app.store_schema import SCHEMA_VERSION, STEPS
from dgchat.app.store_search import (
    CONTROL,
    MAX_SEARCH_CHARS,
    MAX_SEARCH_WORDS,
    clean_search,
    fold,
    fts_query,
    search_saved,
    search_words,
)

__all__ = [
    "DEFAULT_TITLE", "HIGHLIGHT_END", "HIGHLIGHT_START", "MAX_RECORDINGS_BYTES_PER_CHAT", "MAX_SEARCH_CHARS",
    "MAX_SEARCH_WORDS", "SCHEMA_VERSION", "STATUSES", "Chat", "Message", "Recording", "SearchError", "SearchHit",
    "Store", "StoreError", "clean_search", "fold", "fts_query", "search_words", "storable",
]

MAX_RECORDINGS_BYTES_PER_CHAT = 8 << 20  # a chat keeps its newest recordings up to this many bytes


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
                STEPS[version](db)
                db.execute(f"PRAGMA user_version = {version + 1}")

    def integrity_ok(self) -> bool:
        return self._query("PRAGMA integrity_check")[0][0] == "ok"

    def recover_interrupted(self) -> int:
        """Answers left 'generating' by a process that died become 'stopped'; returns how many."""
        rows = self._query("SELECT id, meta FROM messages WHERE status = 'generating'")
        dead = [r["id"] for r in rows if not _pid_alive(_pid_of(json_dict(r["meta"])))]
        if dead:
            with self._tx() as db:
                for message_id in dead:
                    meta = json_dict(db.execute("SELECT meta FROM messages WHERE id = ?", (message_id,)).fetchone()[0])
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
            params=json_dict(row["params"]), created_at=row["created_at"], updated_at=row["updated_at"],
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
            meta=json_dict(row["meta"]), created_at=row["created_at"], parent_id=row["parent_id"],
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
            merged = json_dict(row["meta"])
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
        text that cannot be a search; never a raw SQLite error (app/store_search.py searches)."""
        return search_saved(self._query, text, limit)

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
    line = " ".join(CONTROL.sub(" ", content).split())
    if not line:
        return DEFAULT_TITLE
    return line if len(line) <= 40 else line[:39].rstrip() + "…"
