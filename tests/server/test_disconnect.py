"""A client that hangs up mid-generation cancels it: the cancel flag reaches the engine within a
denoising step, streamed (Starlette's disconnect listener) or not (the server's own watcher)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent
from dgchat.server.app import ServeConfig, ServerThread

BODY = {"messages": [{"role": "user", "content": "Who goes there?"}], "max_tokens": 64, "seed": 1,
        "dgchat": {"steps": 64}}


@pytest.fixture()
def slow_engine(llada_gguf: Path, monkeypatch) -> Iterator[tuple[DiffusionEngine, list]]:
    """The real engine, 50 ms slower per step; records for each step whether cancel was already set."""
    with load_engine(llada_gguf, n_threads=1) as engine:
        trace: list = []
        generate = engine.generate

        def slow(*args, cancel, **kwargs):
            for event in generate(*args, cancel=cancel, **kwargs):
                trace.append("final:" + event.stop_reason if isinstance(event, FinalEvent) else cancel.is_set())
                if not isinstance(event, FinalEvent):
                    time.sleep(0.05)
                yield event

        monkeypatch.setattr(engine, "generate", slow)
        yield engine, trace


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [True, False])
def test_hanging_up_cancels_the_generation_within_a_step(slow_engine, stream: bool) -> None:
    engine, trace = slow_engine
    with ServerThread(engine, ServeConfig(port=0, quiet=True)) as st:
        data = json.dumps({**BODY, "stream": stream}).encode()
        s = socket.create_connection(st.server.address, timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        if stream:
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
        _wait(lambda: len(trace) >= 5)
        s.close()
        t0 = time.monotonic()
        _wait(lambda: st.server.service.status()["running"] == 0)
        assert time.monotonic() - t0 < 1.0
        assert trace[-1] == "final:cancelled"
        steps = trace[:-1]
        assert len(steps) < 30  # far from the 64 it would have taken
        assert steps.count(True) <= 1  # at most the step that was running when the client left
