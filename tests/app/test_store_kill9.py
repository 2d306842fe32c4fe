"""kill -9 of the real app mid-answer (issue 14: "nothing lost").

The app runs as `python -m dgchat` in a pseudo-terminal, exactly as a user starts it; a prompt is
typed and sent; once the answer's decided text has been checkpointed to the database the process is
killed with SIGKILL. The reopened store has the user's message, the answer marked stopped with the
text decided so far, and passes SQLite's integrity check.
"""

from __future__ import annotations

import os
import pty
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from dgchat.app.store import Store

PROMPT = "Halt, traveller! Who goes there at this hour?"


def _drain(fd: int, stop: threading.Event) -> None:
    """Keep reading the terminal so the app never blocks on a full pty buffer."""
    while not stop.is_set():
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def _answer_row(db: Path) -> tuple[str, str] | None:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            row = con.execute("SELECT status, content FROM messages WHERE role = 'assistant' ORDER BY id DESC LIMIT 1"
                              ).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return row


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_kill_9_mid_answer_keeps_the_prompt_and_the_partial_answer(tmp_path: Path, llada_gguf: Path) -> None:
    home = tmp_path / "dgchat-home"
    (home / "config").mkdir(parents=True)
    # a long answer (1024 tokens, 1024 steps) so that it is still running after its first checkpoints
    (home / "config" / "config.toml").write_text("[sampler]\nsteps = 1024\ngen_length = 1024\nblock_length = 32\n")
    db = home / "data" / "chats.db"
    env = {**os.environ, "DGCHAT_HOME": str(home), "HOME": str(tmp_path), "TERM": "xterm-256color",
           "COLUMNS": "100", "LINES": "30", "GGML_NO_BACKTRACE": "1"}
    env.pop("DGCHAT_MODEL", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the app, as a user runs it
        os.execve(sys.executable, [sys.executable, "-m", "dgchat", "-m", str(llada_gguf)], env)
    stop = threading.Event()
    reader = threading.Thread(target=_drain, args=(fd, stop), daemon=True)
    reader.start()
    killed = False
    try:
        deadline = time.monotonic() + 60
        while not db.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert db.exists(), "the app did not start"
        time.sleep(1.5)  # the first screen is up; a message sent while the model loads is answered after
        os.write(fd, PROMPT.encode())
        time.sleep(0.3)
        os.write(fd, b"\r")
        checkpointed = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            row = _answer_row(db)
            if row is not None and row[0] == "generating" and row[1]:
                checkpointed = row[1]
                break
            time.sleep(0.1)
        assert checkpointed, "no checkpointed answer text appeared"
        os.kill(pid, signal.SIGKILL)
        killed = True
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        if not killed:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        stop.set()
        os.close(fd)
    with Store(db) as store:
        assert store.integrity_ok()
        chats = store.list_chats()
        assert len(chats) == 1
        messages = store.messages(chats[0].id)
        assert [(m.role, m.content) for m in messages[:1]] == [("user", PROMPT)]
        answer = messages[1]
        assert answer.role == "assistant" and answer.status == "stopped"
        assert answer.meta.get("stop_reason") == "interrupted" and "pid" not in answer.meta
        # every checkpoint seen before the kill survived (committed tokens never change; the last
        # characters may have been a partial UTF-8 sequence then)
        assert answer.content.startswith(checkpointed[:-2]) and len(answer.content) >= len(checkpointed)
