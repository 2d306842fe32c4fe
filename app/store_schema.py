"""The saved-chat database's schema, as upgrade steps: `STEPS[i]` upgrades version i to i + 1
(PRAGMA user_version is the version). app/store.py's docstring describes the resulting tables;
`Store` runs the steps it has not run yet, each in its own transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable


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


STEPS: list[Callable[[sqlite3.Connection], None]] = [_step_1, _step_2, _step_3, _step_4]
SCHEMA_VERSION = len(STEPS)
