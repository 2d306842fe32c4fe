"""`dgchat serve` and `dgchat npc` with a block-diffusion model (the tiny SDAR conversion of
fixtures.block_tiny), as a user runs them: the server answers a chat with the model's block details in
/v1/models; `dgchat npc` writes free lines and refuses a template entry, naming it, before generating."""

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

import pytest
from fixtures.block_tiny import converted

from dgchat.npc.export import validate_export

CARDS = '[[card]]\nid = "gate_guard"\nname = "Captain Brann"\nrole = "the night captain"\n'
FREE = ('[defaults]\ncount = 3\nlength = "bark"\n\n[[line]]\ncharacter = "gate_guard"\ncontext = "gate"\nseed = 2\n'
        '\n[[line]]\ncharacter = "Captain Brann"\ncontext = "night"\nlength = 6\nseed = 9\n')


@pytest.fixture(scope="module")
def sdar(base: Path) -> Path:
    return converted(base, "sdar")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DGCHAT_API_TOKEN"}


def test_serve_a_block_model(sdar: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "dgchat", "serve", "-m", str(sdar), "--port", "0", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True, env=_env())
    try:
        url, seen = None, ""
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen += line
            m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            url = m.group(1) if m else None
            assert line or proc.poll() is None, f"the server exited: {seen}"
        assert url, f"no address printed: {seen}"
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
            details = json.load(resp)["data"][0]["dgchat"]
        assert (details["family"], details["attention_block"], details["variant"]) == ("block_diffusion", 4, "sdar")
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 1}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            reply = json.load(resp)
        assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] <= 3
        assert reply["dgchat"]["params"]["steps"] == {"value": 4, "source": "model file"}
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[1]
        assert proc.returncode == 0, rest
        assert "POST /v1/chat/completions 200" in rest and "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _npc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", "npc", *args], capture_output=True, text=True, timeout=180,
                          env=_env())


def test_npc_free_lines_and_a_refused_template(sdar: Path, tmp_path: Path) -> None:
    cards, lines = tmp_path / "cards.toml", tmp_path / "lines.toml"
    cards.write_text(CARDS)
    lines.write_text(FREE)
    common = ["--cards", str(cards), "--template", str(lines), "-m", str(sdar), "--threads", "1"]
    res = _npc(*common, "--out", str(tmp_path / "lines.json"))
    assert res.returncode == 0, res.stderr
    assert "6 lines from 2 entries written" in res.stderr
    doc = json.loads((tmp_path / "lines.json").read_text(encoding="utf-8"))
    validate_export(doc)
    assert [line["id"] for line in doc["lines"]] == [
        "gate_guard.gate.2", "gate_guard.gate.3", "gate_guard.gate.4", "gate_guard.night.9", "gate_guard.night.10",
        "gate_guard.night.11"]
    first = doc["lines"][:3]
    assert len({line["text"] for line in first}) > 1  # the variants sample apart (the NPC layer's temperature)
    assert all(line["settings"]["temperature"] == 0.8 and line["settings"]["max_tokens"] in (12, 6)
               for line in doc["lines"])
    assert all(line["holes"] == [] for line in doc["lines"])
    res = _npc(*common, "--out", str(tmp_path / "again.json"))
    assert res.returncode == 0 and json.loads((tmp_path / "again.json").read_text(encoding="utf-8")) == doc
    # a template entry: the run stops before any line is generated, naming the entry
    lines.write_text(FREE + '\n[[line]]\ncharacter = "gate_guard"\ntemplate = "Halt, {___:2} after dark."\n')
    res = _npc(*common, "--out", str(tmp_path / "x.json"))
    assert res.returncode == 2, res.stderr
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("dgchat: error: ") and "lines.toml" in error and "[[line]] 3" in error, error
    assert "block diffusion (SDAR, blocks of 4)" in error and "cannot fill line templates" in error
    assert not (tmp_path / "x.json").exists() and "Traceback" not in res.stderr
