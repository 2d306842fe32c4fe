"""A stored chat whose answer carries escape sequences (issue 31): the app shows them as pictures
(␛]0;pwned␇) and no byte of them reaches the terminal, under Pilot (the bytes Textual would write
for the screen) and in a pseudo-terminal (the real app, as a user runs it).

The probe that found it: an answer containing `ESC]0;pwned BEL` and `ESC[2J` set the terminal's
title and cleared its screen, and, the answer being stored, did it again on every reopen."""

from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest

from fixtures.app_harness import SIZE, make_app, setup_home, wait_for

from dgchat.app.store import Store

TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
ANSWER = f"Halt, traveller.{TITLE}{CLEAR} The gate is shut \u202egnp.exe till dawn."
SHOWN = "Halt, traveller.␛]0;pwned␇␛[2J The gate is shut \ufffdgnp.exe till dawn."


def _seed_chat(db: Path) -> int:
    with Store(db) as store:
        chat = store.create_chat()
        store.add_message(chat.id, "user", f"Who goes there?{CLEAR}")
        store.add_message(chat.id, "assistant", ANSWER,
                          meta={"model": f"evil{TITLE}", "stats": {"tokens": 12, "steps": 8}})
        store.rename_chat(chat.id, f"gate {TITLE}")
        return chat.id


def _terminal_output(app) -> str:
    """What Textual writes to the terminal for the whole screen now (the compositor's full update,
    rendered as the driver gets it)."""
    return app.screen._compositor.render_update(full=True).render_segments(app.console)


def _payload_free(out: str) -> None:
    assert TITLE not in out and "\x1b]0;" not in out  # Textual itself sets no title
    assert CLEAR not in out  # nor clears the screen (it uses the alternate screen)
    assert "\u202e" not in out


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminal and POSIX file modes")
async def test_a_stored_answer_with_escape_sequences_shows_pictures_and_drives_nothing(tmp_path, monkeypatch,
                                                                                          llada_gguf):
    from textual.widgets import Markdown

    from dgchat.app.error_modal import ErrorModal
    from dgchat.app.widgets.message import MessageView

    home = setup_home(tmp_path, monkeypatch)
    chat_id = _seed_chat(home / "data" / "chats.db")
    app = make_app(llada_gguf, chat=chat_id)
    async with app.run_test(size=SIZE, notifications=True) as pilot:  # (Pilot hides notices by default)
        screen = app.chat_screen
        await wait_for(pilot, lambda: len(screen.query(MessageView)) == 2, what="the stored chat")
        await pilot.pause(0.3)  # Markdown parses and lays out over the next refreshes
        answer = screen.query(MessageView).last()
        # the Markdown view is given the picture text; the database keeps the exact answer
        assert answer.query_one(Markdown).source == SHOWN
        assert answer.message.content == ANSWER
        out = _terminal_output(app)
        _payload_free(out)
        assert "␛]0;pwned␇␛[2J" in out  # the answer, visible
        assert out.count("gate ␛]0;pwned␇") == 2  # the chat's title in the sidebar and the header
        assert "evil␛]0;pwned␇" in out  # the model named in the answer's line
        assert "Who goes there?␛[2J" in out  # the stored prompt

        # a server's error quoted in a notice and in a dialog
        app.notify(f"{TITLE}[b]x[/b]{CLEAR}", severity="error")
        await pilot.pause(0.3)
        out = _terminal_output(app)
        _payload_free(out)
        assert "␛]0;pwned␇[b]x[/b]␛[2J" in out  # text, not markup
        app.push_screen(ErrorModal("Generation failed", f"upstream 502:\n{TITLE}<html>{CLEAR}"))
        await pilot.pause(0.3)
        out = _terminal_output(app)
        _payload_free(out)
        assert "␛]0;pwned␇<html>␛[2J" in out
        await pilot.press("escape")
        await pilot.pause()

        # what the prompt box holds (a paste) is laid out by the TextArea itself: the output guard
        # keeps its control characters off the terminal
        prompt = screen.query_one("#prompt")
        prompt.insert(f"pasted {TITLE}{CLEAR}")
        await pilot.pause(0.2)
        out = _terminal_output(app)
        _payload_free(out)
        assert "pasted ]0;pwned[2J" in out


def _drain_until(fd: int, deadline: float, buffer: bytearray, want: bytes | None = None) -> None:
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            buffer.extend(chunk)
            if want is not None and want in buffer:
                return


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_the_real_app_in_a_terminal_never_writes_the_answers_escape_sequences(tmp_path, llada_gguf):
    """`dgchat --chat ID` in a pty, as a user opens the stored chat: the bytes the app writes for a
    few seconds hold the answer as pictures and not one of its sequences."""
    home = tmp_path / "dgchat-home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("[sampler]\nsteps = 8\ngen_length = 32\n")
    chat_id = _seed_chat(home / "data" / "chats.db")
    env = {**os.environ, "DGCHAT_HOME": str(home), "HOME": str(tmp_path), "TERM": "xterm-256color",
           "COLUMNS": "110", "LINES": "34", "GGML_NO_BACKTRACE": "1",
           "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"), "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    env.pop("DGCHAT_MODEL", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the app, as a user runs it
        os.execve(sys.executable, [sys.executable, "-m", "dgchat", "-m", str(llada_gguf), "--chat", str(chat_id)], env)
    out = bytearray()
    try:
        _drain_until(fd, time.monotonic() + 60, out, "␛]0;pwned␇".encode())
        _drain_until(fd, time.monotonic() + 3, out)  # a few more seconds of redraws
        os.write(fd, b"\x11")  # Ctrl+Q
        _drain_until(fd, time.monotonic() + 10, out)
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    assert "␛]0;pwned␇".encode() in out, bytes(out[-2000:])
    assert b"\x1b]0;pwned" not in out and b"\x07\x1b[2J" not in out
    assert b"\x1b[2J" not in out  # Textual clears nothing with it: any 2J would be the answer's
    assert "\u202e".encode() not in out
