"""`dgchat serve` as a user runs it: refusing an open host without a token, Ctrl-C stops it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def _env() -> dict[str, str]:  # the test's isolated environment, without a token from the caller's
    return {k: v for k, v in os.environ.items() if k != "DGCHAT_API_TOKEN"}


def test_open_host_needs_a_token_before_loading_anything() -> None:
    res = subprocess.run([sys.executable, "-m", "dgchat", "serve", "--host", "0.0.0.0", "-m", "/nonexistent.gguf"],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert res.returncode == 2
    assert "dgchat: error: --host 0.0.0.0 is not a loopback address" in res.stderr and "--token" in res.stderr


def test_serve_answers_and_stops_on_ctrl_c(llada_gguf: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "dgchat", "serve", "-m", str(llada_gguf), "--port", "0",
                             "--threads", "1"], stderr=subprocess.PIPE, text=True, env=_env())
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            url = m.group(1) if m else None
            assert line or proc.poll() is None, "the server exited"
        assert url, "no address printed"
        with urllib.request.urlopen(url + "/health", timeout=30) as resp:
            assert json.load(resp)["status"] == "ok"
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.load(resp)["object"] == "chat.completion"
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[1]
        assert proc.returncode == 0, rest
        assert "shutting down" in rest and "dgchat serve: stopped" in rest
        assert "POST /v1/chat/completions 200" in rest  # the access log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, str]:
    """Start `dgchat serve`, return it, its URL and the stderr read up to the ready line."""
    proc = subprocess.Popen([sys.executable, "-m", "dgchat", "serve", "--port", "0", "--threads", "1", *args],
                            stderr=subprocess.PIPE, text=True, env=env or _env())
    seen = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
        if m:
            return proc, m.group(1), seen
        assert line or proc.poll() is None, f"the server exited: {seen}"
    proc.kill()
    raise AssertionError(f"no address printed: {seen}")


def test_sigterm_stops_the_server_after_its_stderr_is_closed(llada_gguf: Path) -> None:
    """The log collector went away: access-log writes now fail with a broken pipe, and SIGTERM must
    still stop the server cleanly (exit code 0), not only SIGKILL."""
    proc, url, _ = _start(["-m", str(llada_gguf)])
    try:
        proc.stderr.close()
        for _ in range(3):  # each request writes an access-log line into the dead pipe
            with urllib.request.urlopen(url + "/health", timeout=30) as resp:
                assert json.load(resp)["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_token_from_a_file_and_a_warning_for_token_on_the_command_line(llada_gguf: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file-123\n")
    proc, url, seen = _start(["-m", str(llada_gguf), "--token-file", str(token_file)])
    try:
        assert "(token required)" in seen and "warning" not in seen
        try:
            urllib.request.urlopen(url + "/health", timeout=30)
            raise AssertionError("answered without the token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        req = urllib.request.Request(url + "/health", headers={"Authorization": "Bearer from-a-file-123"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # --token shows in `ps`: said once, before anything else happens
    res = subprocess.run([sys.executable, "-m", "dgchat", "serve", "--token", "short", "-m", "/nonexistent.gguf"],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert res.returncode == 2 and "visible to other users" in res.stderr and "at least 8" in res.stderr
    for content, message in (("", "is empty"), (None, "cannot read --token-file")):
        path = tmp_path / "missing" if content is None else tmp_path / "empty"
        if content is not None:
            path.write_text(content)
        res = subprocess.run([sys.executable, "-m", "dgchat", "serve", "--token-file", str(path), "-m",
                              "/nonexistent.gguf"], capture_output=True, text=True, timeout=60, env=_env())
        assert res.returncode == 2 and message in res.stderr, res.stderr
