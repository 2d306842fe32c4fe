"""`dgchat serve` as a user runs it: refusing an open host without a token, Ctrl-C stops it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
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
