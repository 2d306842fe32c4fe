"""RemoteClient against servers that misbehave: retries with backoff, timeouts, clear errors."""

from __future__ import annotations

import time

import pytest
from fixtures.fake_openai import FakeServer, Reply, SilentServer, free_port

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.remote import RemoteClient, RemoteTimeout, ServerUnreachable, StreamBroken, normalize_url
from dgchat.remote.errors import RemoteApiError

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]}


def _scripted(*replies: Reply) -> FakeServer:
    """A server answering the given replies in order (the last one from then on)."""
    queue = list(replies)

    def handler(method, path, body) -> Reply:
        return queue.pop(0) if len(queue) > 1 else queue[0]
    return FakeServer(handler)


def test_urls() -> None:
    assert normalize_url(" http://gpu-box:8765/v1/ ") == "http://gpu-box:8765"
    assert normalize_url("https://example.org/api") == "https://example.org/api"
    for bad in ("gpu-box:8765", "ftp://x", "http://", ""):
        with pytest.raises(InvalidParameterError, match="--server takes a URL"):
            normalize_url(bad)


def test_5xx_and_429_are_retried_with_backoff_4xx_are_not() -> None:
    slept: list[float] = []
    busy = Reply(503, {"error": {"message": "the server is shutting down", "type": "server_error", "param": None,
                                 "code": "shutting_down"}})
    full = Reply(429, {"error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": "queue_full"}},
                 headers={"Retry-After": "3"})
    with _scripted(busy, busy, full, Reply(body=MODELS)) as server:
        client = RemoteClient(server.url, retries=3, backoff=0.5, sleep=slept.append)
        assert [m.id for m in client.models()] == ["m"]
        assert len(server.requests) == 4 and slept == [0.5, 1.0, 3.0]  # doubling; the server's Retry-After wins
    slept.clear()
    with _scripted(busy) as server:
        client = RemoteClient(server.url, retries=2, backoff=0.5, sleep=slept.append)
        with pytest.raises(RemoteApiError, match=r"answered 503: the server is shutting down") as info:
            client.models()
        assert info.value.status == 503 and len(server.requests) == 3 and slept == [0.5, 1.0]
    bad = Reply(400, {"error": {"message": "`temperature` must be between 0.0 and 2.0 (got 9)", "type":
                                "invalid_request_error", "param": "temperature", "code": None}})
    with _scripted(bad) as server:
        client = RemoteClient(server.url, retries=3, sleep=slept.append)
        with pytest.raises(RemoteApiError, match="answered 400: `temperature` must be") as info:
            client.post_json("/v1/chat/completions", {"temperature": 9})
        assert len(server.requests) == 1 and info.value.param == "temperature" and not info.value.retryable


def test_server_down() -> None:
    slept: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"
    client = RemoteClient(url, retries=2, backoff=0.25, sleep=slept.append)
    with pytest.raises(ServerUnreachable, match=rf"^cannot reach {url}: connection refused$"):
        client.models()
    assert slept == [0.25, 0.5]


def test_a_server_that_never_answers_times_out_once() -> None:
    with SilentServer() as server:
        client = RemoteClient(server.url, timeout=0.5, retries=3, sleep=lambda s: None)
        start = time.monotonic()
        with pytest.raises(RemoteTimeout, match=r"did not answer /v1/models within 0\.5 s"):
            client.models()
        assert time.monotonic() - start < 2.0  # a timeout is not retried on the same server
        with pytest.raises(RemoteTimeout):
            list(client.stream("/v1/chat/completions", {"messages": []}))


def test_a_stream_that_stops_early_is_broken_not_finished() -> None:
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Ha"},
                                                              "finish_reason": None}]}
    with _scripted(Reply(events=[chunk])) as server:  # no [DONE]
        client = RemoteClient(server.url, retries=0)
        seen = []
        with pytest.raises(StreamBroken, match="ended the answer early"):
            for obj in client.stream("/v1/chat/completions", {"messages": []}):
                seen.append(obj)
        assert seen == [chunk]


def test_the_config_s_server_table(tmp_path) -> None:
    from dgchat.config import ConfigError, load_config

    path = tmp_path / "config.toml"
    path.write_text('[server]\nurl = "http://gpu-box:8765"\napi_key = "sk-123"\n')
    config = load_config(path)
    assert (config.server_url, config.server_api_key) == ("http://gpu-box:8765", "sk-123")
    assert load_config(tmp_path / "missing.toml").server_url is None
    for table, message in (('url = "gpu-box:8765"', "url must be an http:// or https:// URL"),
                           ('adress = "http://x"', "unknown setting 'adress'"),
                           ('api_key = ""', "api_key must be a non-empty string")):
        path.write_text(f"[server]\n{table}\n")
        with pytest.raises(ConfigError, match=message):
            load_config(path)
