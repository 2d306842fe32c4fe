"""The chat store on a real SQLite file: schema upgrades, search, crash safety."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dgchat.app.export import chat_markdown, export_chat
from dgchat.app.store import DEFAULT_TITLE, SCHEMA_VERSION, Store, StoreError, fts_query


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "chats.db"


def test_chats_and_messages_round_trip(db):
    with Store(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        chat = store.create_chat(system_prompt="be brief", params={"steps": 16})
        assert chat.title == DEFAULT_TITLE
        u = store.add_message(chat.id, "user", "  Where is the\nking?  ")
        a = store.add_message(chat.id, "assistant", "Asleep.", meta={"stats": {"tokens": 3}})
        assert store.get_chat(chat.id).title == "Where is the king?"  # named after the first prompt
        assert [m.id for m in store.messages(chat.id)] == [u.id, a.id]
        assert store.messages(chat.id)[1].meta == {"stats": {"tokens": 3}}
        store.rename_chat(chat.id, "  The   king ")
        store.update_chat_settings(chat.id, model="/m.gguf", system_prompt="", params={"temperature": 0.5})
    with Store(db) as store:  # everything survives a reopen
        chat = store.get_chat(chat.id)
        assert (chat.title, chat.model, chat.system_prompt, chat.params) == ("The king", "/m.gguf", "", {"temperature": 0.5})
        other = store.create_chat("second")
        assert [c.id for c in store.list_chats()] == [other.id, chat.id]  # most recently updated first
        store.add_message(chat.id, "user", "again")
        assert [c.id for c in store.list_chats()] == [chat.id, other.id]
        store.delete_chat(chat.id)
        assert store.get_chat(chat.id) is None
        assert store.messages(chat.id) == []
        assert store.search("king") == []  # the index follows deletions
        assert store.integrity_ok()


def test_ids_are_never_reused(db):
    with Store(db) as store:
        chat = store.create_chat()
        m = store.add_message(chat.id, "user", "x")
        store.delete_message(m.id)
        assert store.add_message(chat.id, "user", "y").id > m.id
        store.delete_chat(chat.id)
        assert store.create_chat().id > chat.id


def test_answer_lifecycle_and_truncation(db):
    with Store(db) as store:
        chat = store.create_chat()
        store.add_message(chat.id, "user", "one")
        answer = store.begin_answer(chat.id, {"model": "m.gguf"})
        assert answer.status == "generating" and answer.meta["pid"] == os.getpid()
        store.checkpoint_answer(answer.id, "partial")
        assert store.get_message(answer.id).content == "partial"
        store.finish_answer(answer.id, "final", "done", {"stop_reason": "eos"})
        done = store.get_message(answer.id)
        assert (done.content, done.status, done.meta) == ("final", "done", {"model": "m.gguf", "stop_reason": "eos"})
        store.checkpoint_answer(answer.id, "late")  # a finished answer is not overwritten by a checkpoint
        assert store.get_message(answer.id).content == "final"
        two = store.add_message(chat.id, "user", "two")
        store.add_message(chat.id, "assistant", "2")
        assert store.delete_after(chat.id, answer.id) == 2
        assert [m.content for m in store.messages(chat.id)] == ["one", "final"]
        assert store.get_message(two.id) is None
        with pytest.raises(ValueError):
            store.finish_answer(answer.id, "x", "bogus")


def test_full_text_search(db):
    with Store(db) as store:
        a = store.create_chat("Dragons")
        store.add_message(a.id, "user", "Where does the dragon live?")
        m = store.add_message(a.id, "assistant", "In the mountains, north of the village. Naïve café.")
        b = store.create_chat("Market")
        store.add_message(b.id, "user", "The baker sells bread")
        hits = store.search("mount")
        assert [(h.chat_id, h.message_id) for h in hits] == [(a.id, m.id)]
        assert "\x02mountains\x03" in hits[0].snippet
        assert {h.chat_id for h in store.search("the")} == {a.id, b.id}
        assert store.search("north village")[0].message_id == m.id  # every word must match
        assert store.search("north bread") == []
        assert store.search("cafe naive")[0].message_id == m.id  # diacritics folded
        assert [h.role for h in store.search("drag")] == ["title", "user"]  # title hits come first
        # FTS syntax in user input is text, never an error
        for nasty in ('"', 'a AND (', "NEAR(", "*", "-x", "col:umn", "'"):
            store.search(nasty)
        assert fts_query("  ") is None
        store.update_message(m.id, "Changed text about gryphons")
        assert store.search("mountains") == []
        assert store.search("gryphon")[0].message_id == m.id


def test_punctuation_in_a_search_never_drops_a_match(db):
    """`sir"` found fewer chats than `sir`: titles were matched on the whole text, quote included,
    while messages were matched word by word. Titles now match as messages do: every word of the
    search (letters and digits; punctuation separates words), case and diacritics folded."""
    with Store(db) as store:
        titled = store.create_chat("Good sir, the gate")
        store.add_message(titled.id, "user", "Open it")
        spoken = store.create_chat("Night watch")
        said = store.add_message(spoken.id, "user", "Good sir, the king spake")
        accented = store.create_chat("Café du Roi")
        store.add_message(accented.id, "user", "bread")

        def found(text: str) -> list[tuple[int, int | None, str]]:
            return [(h.chat_id, h.message_id, h.role) for h in store.search(text)]

        plain = found("sir")
        assert plain == [(titled.id, None, "title"), (spoken.id, said.id, "user")]
        for text in ('sir"', '"sir"', "sir,", "(sir)", "sir!", "SIR?", "'sir'", "sir…", "«sir»"):
            assert found(text) == plain, text
        assert found("good, sir") == found("good sir") and len(found("good sir")) == 2
        assert found("gate sir") == [(titled.id, None, "title")]  # every word, in any order
        assert found("sir king") == [(spoken.id, said.id, "user")]
        assert found("cafe roi") == [(accented.id, None, "title")]  # diacritics folded, as in messages
        assert found("CAFÉ") == [(accented.id, None, "title")]
        assert found('"') == [] and found("…") == []  # no word at all: nothing to find


def test_prompt_history_and_settings(db):
    with Store(db) as store:
        chat = store.create_chat()
        for text in ("a", "b", "a", "c"):
            store.add_message(chat.id, "user", text)
        store.add_message(chat.id, "assistant", "not a prompt")
        assert store.prompt_history() == ["c", "a", "b"]
        assert store.get_setting("theme", "dark") == "dark"
        store.set_setting("theme", "textual-light")
        store.set_setting("theme", "textual-dark")
        assert store.get_setting("theme") == "textual-dark"


def test_upgrade_from_schema_1_keeps_and_indexes_old_messages(db):
    with Store(db, upgrade_to=1) as old:
        assert old.schema_version == 1
    raw = sqlite3.connect(db)
    raw.execute("INSERT INTO chats(title, created_at, updated_at) VALUES ('old chat', 1, 1)")
    raw.execute("INSERT INTO messages(chat_id, role, content, status, created_at) VALUES (1, 'user', 'ancient scrolls', 'done', 1)")
    raw.commit()
    raw.close()
    with Store(db) as store:
        assert store.schema_version == SCHEMA_VERSION
        [message] = store.messages(1)
        assert (message.content, message.meta) == ("ancient scrolls", {})
        assert store.search("scroll")[0].message_id == message.id


def test_upgrade_from_schema_2_keeps_each_chat_as_one_conversation(db):
    """A database written before answer versions (schema 2) opens with every message kept, in
    order, each chat one chain of single versions, still searchable, and takes versions from then on."""
    with Store(db, upgrade_to=2) as old:
        assert old.schema_version == 2
    raw = sqlite3.connect(db)
    raw.execute("INSERT INTO chats(title, created_at, updated_at) VALUES ('old chat', 1, 1)")
    raw.execute("INSERT INTO chats(title, created_at, updated_at) VALUES ('other chat', 1, 1)")
    rows = [(1, "user", "first question"), (2, "user", "elsewhere"), (1, "assistant", "first answer"),
            (1, "user", "second question"), (2, "assistant", "over there"), (1, "assistant", "second answer")]
    for chat_id, role, content in rows:  # interleaved ids: each chat's chain must stay within it
        raw.execute("INSERT INTO messages(chat_id, role, content, status, meta, created_at) VALUES (?, ?, ?, 'done', "
                    "'{\"stats\": {\"tokens\": 2}}', 1)", (chat_id, role, content))
    raw.commit()
    raw.close()
    with Store(db) as store:
        assert store.schema_version == SCHEMA_VERSION == 4
        first = store.messages(1)
        assert [m.content for m in first] == ["first question", "first answer", "second question", "second answer"]
        assert [m.parent_id for m in first] == [None, first[0].id, first[1].id, first[2].id]
        assert all((m.version, m.versions, m.meta) == (1, 1, {"stats": {"tokens": 2}}) for m in first)
        assert [m.content for m in store.messages(2)] == ["elsewhere", "over there"]
        assert [h.message_id for h in store.search("second answer")] == [first[3].id]
        again = store.begin_answer(1, version_of=first[3].id)
        assert [m.id for m in store.messages(1)] == [m.id for m in first[:3]] + [again.id]
        assert [v.id for v in store.versions(again.id)] == [first[3].id, again.id]
        assert store.integrity_ok()


def test_versions_of_a_turn_and_the_conversation_shown(db):
    with Store(db) as store:
        chat = store.create_chat()
        q = store.add_message(chat.id, "user", "the question")
        a1 = store.add_message(chat.id, "assistant", "first answer")
        a2 = store.begin_answer(chat.id, version_of=a1.id)  # regenerate
        store.finish_answer(a2.id, "second answer", "done")
        shown = store.messages(chat.id)
        assert [m.id for m in shown] == [q.id, a2.id]
        assert [(m.version, m.versions) for m in shown] == [(1, 1), (2, 2)]
        assert (store.get_message(a1.id).version, store.get_message(a1.id).versions) == (1, 2)
        # the version shown is the conversation: a new prompt continues it
        store.show_version(a1.id)
        assert [m.content for m in store.messages(chat.id)] == ["the question", "first answer"]
        follow = store.add_message(chat.id, "user", "and then?")
        assert follow.parent_id == a1.id
        store.show_version(a2.id)
        assert [m.id for m in store.messages(chat.id)] == [q.id, a2.id]  # that branch has no follow-up
        store.show_version(follow.id)  # showing a message shows the versions leading to it (search hits)
        assert [m.id for m in store.messages(chat.id)] == [q.id, a1.id, follow.id]
        # search finds every version; export writes the one shown, saying which
        assert {h.message_id for h in store.search("answer")} == {a1.id, a2.id}
        text = chat_markdown(store.get_chat(chat.id), store.messages(chat.id))
        assert "first answer" in text and "second answer" not in text
        assert "## Assistant (version 1 of 2)\n\nfirst answer" in text and "## You\n\nthe question" in text
        # an edited prompt is a version of its turn: the old prompt keeps its whole continuation
        q2 = store.add_message(chat.id, "user", "the question, edited", version_of=q.id)
        assert q2.parent_id is None and (q2.version, q2.versions) == (2, 2)
        assert [m.id for m in store.messages(chat.id)] == [q2.id]
        store.show_version(q.id)
        assert [m.id for m in store.messages(chat.id)] == [q.id, a1.id, follow.id]
        # deleting the shown version removes its branch and shows the newest remaining version
        store.delete_message(a1.id)
        assert store.get_message(follow.id) is None and store.search("then") == []
        shown = store.messages(chat.id)
        assert [m.id for m in shown] == [q.id, a2.id] and (shown[1].version, shown[1].versions) == (1, 1)
        other = store.create_chat()
        with pytest.raises(StoreError, match="not in chat"):
            store.add_message(other.id, "user", "x", version_of=q.id)
        assert store.versions(10_000) == []
        assert store.integrity_ok()


def test_a_newer_schema_is_refused(db):
    Store(db).close()
    raw = sqlite3.connect(db)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="newer dgchat"):
        Store(db)


def test_a_file_that_is_not_a_database_is_a_clear_error(db):
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable chat database"):
        Store(db)


_WRITER = textwrap.dedent(
    """
    import sys, time
    from dgchat.app.store import Store
    store = Store(sys.argv[1])
    chat = store.create_chat()
    store.add_message(chat.id, "user", "a prompt typed just before the crash")
    answer = store.begin_answer(chat.id, {"model": "m.gguf"})
    print(chat.id, answer.id, flush=True)
    i = 0
    while True:  # an answer being checkpointed, like the app does while the canvas denoises
        i += 1
        store.checkpoint_answer(answer.id, "word " * i)
        print(i, flush=True)
        time.sleep(0.002)
    """
)


def test_reopen_after_a_kill_mid_answer(db, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(db)], stdout=subprocess.PIPE, text=True)
    try:
        chat_id, answer_id = map(int, proc.stdout.readline().split())
        last = 0
        deadline = time.monotonic() + 30
        while last < 20 and time.monotonic() < deadline:
            last = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert last >= 20
    with Store(db) as store:
        assert store.integrity_ok()
        messages = store.messages(chat_id)
        assert [m.role for m in messages] == ["user", "assistant"]
        assert messages[0].content == "a prompt typed just before the crash"
        answer = messages[1]
        assert answer.id == answer_id
        assert answer.status == "stopped"  # recovered: the writer is gone
        assert answer.meta == {"model": "m.gguf", "stop_reason": "interrupted"}
        n = answer.content.count("word")
        assert n >= last  # every checkpoint the writer reported is on disk
        assert messages[0].id in [h.message_id for h in store.search("crash")]


def test_a_live_writer_is_not_recovered(db):
    """Another process that is still generating keeps its answer 'generating'."""
    with Store(db) as store:
        chat = store.create_chat()
        answer = store.begin_answer(chat.id)
        # pretend the row belongs to our parent process, which is alive
        store._db.execute("UPDATE messages SET meta = ? WHERE id = ?", (json.dumps({"pid": os.getppid()}), answer.id))
    with Store(db) as store:
        assert store.get_message(answer.id).status == "generating"


def test_markdown_export(db, tmp_path):
    with Store(db) as store:
        chat = store.create_chat("Plan", system_prompt="You are terse.")
        store.add_message(chat.id, "user", "Plan a trip")
        a = store.begin_answer(chat.id, {"model": "tiny.gguf"})
        store.finish_answer(a.id, "1. Go\n2. Return", "stopped")
        messages = store.messages(chat.id)
        chat = store.get_chat(chat.id)
    text = chat_markdown(chat, messages)
    assert text == (
        "# Plan\n\n> model: `tiny.gguf`\n\n## System\n\nYou are terse.\n\n## You\n\nPlan a trip\n\n"
        "## Assistant\n\n1. Go\n2. Return\n\n_(stopped: partial answer)_\n"
    )
    target = tmp_path / "exports" / "plan.md"
    target.parent.mkdir()
    target.write_text("old")
    export_chat(chat, messages, target)
    assert target.read_text() == text
    assert os.listdir(target.parent) == ["plan.md"]


def test_recordings_are_kept_per_answer_bounded_per_chat_and_deleted_with_it(db, monkeypatch):
    """Schema 4: an answer's recording is saved with it in one transaction; older answers (from a
    schema 3 database) have none; a chat keeps its newest recordings under the bound (older ones
    are dropped but say so); deleting a message or a chat deletes its recordings."""
    from dgchat.app import store as store_module

    with Store(db, upgrade_to=3) as old:
        chat = old.create_chat("old")
        old.add_message(chat.id, "user", "hi")
        before = old.add_message(chat.id, "assistant", "an old answer")
    monkeypatch.setattr(store_module, "MAX_RECORDINGS_BYTES_PER_CHAT", 2500)
    with Store(db) as store:
        assert store.schema_version == 4
        assert store.recording(before.id) is None  # never recorded
        other = store.create_chat("other")
        answers = []
        for i in range(3):
            answer = store.begin_answer(chat.id)
            store.finish_answer(answer.id, f"answer {i}", "done", {"stats": {"tokens": 2}},
                                recording=bytes([i]) * 1000)
            answers.append(answer)
        elsewhere = store.begin_answer(other.id)
        store.finish_answer(elsewhere.id, "x", "done", recording=b"z" * 2000)
        # 3 x 1000 bytes in a chat bounded at 2500: the oldest is dropped, the row says so
        assert store.recording(answers[0].id).data is None and store.recording(answers[0].id).size == 1000
        assert [store.recording(a.id).data for a in answers[1:]] == [b"\x01" * 1000, b"\x02" * 1000]
        assert store.recordings_size(chat.id) == 2000 and store.recordings_size(other.id) == 2000
        store.delete_message(answers[2].id)
        assert store.recording(answers[2].id) is None
        store.delete_chat(other.id)
        assert store.recording(elsewhere.id) is None
    with Store(db) as store:  # durable
        assert store.recording(answers[1].id).data == b"\x01" * 1000
