"""`dgchat npc` over several `dgchat serve` servers: the same export as a local run, in the same
order, even when a server dies in the middle of the batch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.fake_openai import FakeServer, Reply

from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.npc.cards import load_cards
from dgchat.npc.export import build_export, export_json
from dgchat.npc.generator import NpcGenerator
from dgchat.npc.lines_file import load_lines_file
from dgchat.remote.npc_lines import check_servers, generate_remote
from dgchat.remote.pool import ServerPool
from dgchat.server.app import ServeConfig, ServerThread

CARDS = """\
[[card]]
id = "gate_guard"
name = "Captain Brann"
role = "the night captain of the city gate"
banned_words = ["okay"]

[[card]]
name = "Mira the Baker"
role = "the baker on Market Street"
"""

# 12 entries: templates (hole lengths chosen by score) and free lines, two characters
LINES = "[defaults]\ncount = 2\nlength = \"bark\"\n\n[variables]\nplayer = \"Aria\"\n" + "".join(
    f'\n[[line]]\ncharacter = "gate_guard"\ncontext = "gate_{i}"\nseed = {10 * i}\n'
    f'template = "Halt, {{player}}! None may pass the {{___:1-2}} after dark."\n'
    f'\n[[line]]\ncharacter = "Mira the Baker"\ncontext = "shop_{i}"\nseed = {10 * i + 5}\n'
    for i in range(6))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("npc")
    (folder / "cards.toml").write_text(CARDS)
    (folder / "lines.toml").write_text(LINES)
    return folder / "cards.toml", folder / "lines.toml"


@pytest.fixture(scope="module")
def specs(files) -> list:
    cards, lines = files
    return load_lines_file(lines).specs(load_cards([str(cards)]))


@pytest.fixture(scope="module")
def local_export(specs, llada_gguf: Path) -> str:
    with load_engine(llada_gguf, n_threads=1) as engine:
        batches = [NpcGenerator(engine).generate(s) for s in specs]
    for b in batches:
        b.keep_all()
    return export_json(build_export(batches))


def _serve(model: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "dgchat", "serve", "-m", str(model), "--port", "0", "--threads",
                             "1"], stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "DGCHAT_API_TOKEN"})
    deadline = time.monotonic() + 60
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        m = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
        if m:
            return proc, m.group(1)
        assert line or proc.poll() is None, f"the server exited: {seen}"
    proc.kill()
    raise AssertionError(f"no address printed: {seen}")


@pytest.fixture()
def two_servers(llada_gguf: Path) -> Iterator[list[tuple[subprocess.Popen, str]]]:
    servers = [_serve(llada_gguf), _serve(llada_gguf)]
    try:
        yield servers
    finally:
        for proc, _url in servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            proc.stderr.close()


def test_a_server_killed_mid_batch(two_servers, specs, local_export: str) -> None:
    (keeper, keeper_url), (victim, victim_url) = two_servers
    done_on: dict[int, str] = {}
    retried: list[int] = []
    errors: list[str] = []

    def on_event(event) -> None:
        if event.kind == "done":
            assert event.index not in done_on, "an entry was finished twice"
            done_on[event.index] = event.server
            if event.server == victim_url and victim.poll() is None:
                victim.send_signal(signal.SIGKILL)  # mid-batch: its other request is in flight or queued
        else:
            retried.append(event.index)
            errors.append(event.error)

    with ServerPool([keeper_url, victim_url], per_server=2, max_failures=2, backoff=0.05) as pool:
        # the export will name the model file the servers serve, as a local run names its own
        assert check_servers(pool) == json.loads(local_export)["model"]
        batches = generate_remote(pool, specs, on_event=on_event)
        stats = pool.stats
    for b in batches:
        b.keep_all()
    # nothing lost, nothing twice, the lines file's order, the lines a local run makes
    assert sorted(done_on) == list(range(len(specs)))
    assert [b.spec for b in batches] == specs
    assert export_json(build_export(batches)) == local_export
    assert victim.poll() is not None and retried  # it died, and its entries went elsewhere
    assert set(retried) <= {i for i, url in done_on.items() if url == keeper_url}
    assert stats[victim_url].failures >= 1 and stats[victim_url].dropped
    assert stats[keeper_url].jobs + stats[victim_url].jobs == len(specs) and stats[keeper_url].failures == 0
    # the request it had in flight when it died broke off, and was done again on the other server
    assert any(e.startswith(f"lost the connection to {victim_url} before its answer") for e in errors), errors


def test_npc_command_on_two_servers(files, llada_gguf: Path, local_export: str, tmp_path: Path) -> None:
    cards, lines = files
    with load_engine(llada_gguf, n_threads=1) as a, load_engine(llada_gguf, n_threads=1) as b:
        with ServerThread(a, ServeConfig(port=0, quiet=True)) as one, ServerThread(b, ServeConfig(port=0, quiet=True)) as two:
            out = tmp_path / "lines.json"
            res = subprocess.run([sys.executable, "-m", "dgchat", "npc", "--cards", str(cards), "--template",
                                  str(lines), "--server", one.url, "--server", two.url + "/v1", "--out", str(out)],
                                 capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert out.read_text(encoding="utf-8") == local_export
    for url in (one.url, two.url):
        assert re.search(rf"dgchat: {re.escape(url)}: \d+ lines in [\d.]+ s \([\d.]+ lines/s\); no failures", res.stderr)
    assert "24 lines from 12 entries on 2 server(s)" in res.stderr
    assert "24 lines from 12 entries written" in res.stderr


def test_only_dgchat_servers_and_one_model(specs) -> None:
    vllm = {"object": "list", "data": [{"id": "google/diffusiongemma-26B-A4B-it", "object": "model",
                                        "owned_by": "vllm", "max_model_len": 32768}]}
    with FakeServer(lambda m, p, b: Reply(body=vllm)) as server, ServerPool([server.url]) as pool:
        with pytest.raises(InvalidParameterError, match="is not a dgchat serve server.*generate --server"):
            check_servers(pool)
    with pytest.raises(InvalidParameterError, match="given twice"):
        ServerPool(["http://127.0.0.1:1", "http://127.0.0.1:1/v1"])
    with pytest.raises(InvalidParameterError, match="--max-attempts must be 1..8"):
        generate_remote(ServerPool(["http://127.0.0.1:1"]), specs, max_attempts=9)

