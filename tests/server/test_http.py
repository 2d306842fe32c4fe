"""`dgchat serve` over real HTTP on loopback: responses, streaming, errors, limits, concurrent clients."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.server import openai_api
from dgchat.server.app import ServeConfig, ServerThread

CHAT = {"messages": [{"role": "system", "content": "You are a guard."}, {"role": "user", "content": "Who goes there?"}],
        "max_tokens": 24, "seed": 3, "temperature": 0.7}


@pytest.fixture(scope="module")
def engine(llada_gguf: Path) -> Iterator[DiffusionEngine]:
    # precise: n choices in one batch equal single requests; 1 thread: no spin-waits on a busy box
    with load_engine(llada_gguf, precise=True, n_threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cards")
    (folder / "guard.toml").write_text('id = "gate_guard"\nname = "Captain Brann"\nrole = "the night captain"\n')
    return folder


@pytest.fixture(scope="module")
def server(engine, cards: Path) -> Iterator[ServerThread]:
    config = ServeConfig(port=0, quiet=True, max_body=64 * 1024, cards=(str(cards),))
    with ServerThread(engine, config) as st:
        yield st


class Client:
    def __init__(self, st: ServerThread, token: str | None = None) -> None:
        self.host, self.port = st.server.address
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        self.token = token

    def request(self, method: str, path: str, body: object = None, headers: dict | None = None,
                raw: bytes | None = None) -> tuple[int, dict, bytes]:
        h = {"Content-Type": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        self.conn.request(method, path, data, h)
        resp = self.conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()

    def json(self, method: str, path: str, body: object = None, **kw) -> tuple[int, dict]:
        status, _headers, data = self.request(method, path, body, **kw)
        return status, json.loads(data)

    def stream(self, path: str, body: dict) -> list:
        status, headers, data = self.request("POST", path, {**body, "stream": True})
        assert status == 200, data
        assert headers["content-type"].startswith("text/event-stream")
        events = []
        for block in data.decode("utf-8").split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        assert events[-1] == "[DONE]"
        return events[:-1]


def _error(status: int, body: dict, want_status: int, code: str | None = None, param: str | None = None) -> str:
    assert status == want_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err["message"]


def test_models_and_health(server) -> None:
    c = Client(server)
    status, body = c.json("GET", "/v1/models")
    assert status == 200 and body["object"] == "list"
    (model,) = body["data"]
    assert model["id"] == "tiny-llada" and model["object"] == "model" and model["owned_by"] == "dgchat"
    assert c.json("GET", "/v1/models/tiny-llada")[1]["id"] == "tiny-llada"
    _error(*c.json("GET", "/v1/models/gpt-4"), 404, "model_not_found")
    status, body = c.json("GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["running"] == 0 and body["queued"] == 0


def test_chat_completion(server, engine) -> None:
    c = Client(server)
    status, body = c.json("POST", "/v1/chat/completions", CHAT)
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "tiny-llada"
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] == engine.chat_prompt(CHAT["messages"]).size
    assert 0 < usage["completion_tokens"] <= 24 and usage["total_tokens"] == usage["prompt_tokens"] + usage[
        "completion_tokens"]
    assert body["dgchat"]["seed"] == 3 and body["dgchat"]["settings"]["temperature"] == 0.7
    again = c.json("POST", "/v1/chat/completions", CHAT)[1]
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]  # same seed, same answer
    other = c.json("POST", "/v1/chat/completions", {**CHAT, "seed": 4})[1]
    assert other["choices"][0]["message"]["content"] != choice["message"]["content"]
    # content given as text parts, a developer message, max_completion_tokens
    parts = {"messages": [{"role": "developer", "content": [{"type": "text", "text": "You are a guard."}]},
                          {"role": "user", "content": "Who goes there?"}],
             "max_completion_tokens": 24, "seed": 3, "temperature": 0.7}
    assert c.json("POST", "/v1/chat/completions", parts)[1]["choices"][0] == choice


def test_streaming_sends_the_decided_prefix(server) -> None:
    c = Client(server)
    answer = c.json("POST", "/v1/chat/completions", CHAT)[1]
    events = c.stream("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}})
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == events[0]["id"] for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"].get("content", "") for e in events[1:] if e["choices"]]
    assert sum(1 for d in deltas if d) >= 2  # it really streamed
    assert "".join(deltas) == answer["choices"][0]["message"]["content"]
    finish = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == answer["usage"]
    # the canvas extension: one chunk per step with the whole canvas
    events = c.stream("/v1/chat/completions", {**CHAT, "dgchat": {"canvas": True}})
    frames = [e["dgchat"] for e in events if "canvas" in e.get("dgchat", {})]
    assert len(frames) == answer["dgchat"]["stats"][0]["steps"]
    assert all(len(f["canvas"]) == len(f["state"]) == answer["dgchat"]["settings"]["gen_length"] for f in frames)
    assert frames[0]["canvas"].count(None) > frames[-1]["canvas"].count(None)  # masks get filled
    assert [f["step"] for f in frames] == list(range(1, len(frames) + 1))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == \
        answer["choices"][0]["message"]["content"]


def test_stop_strings(server) -> None:
    c = Client(server)
    full = c.json("POST", "/v1/chat/completions", CHAT)[1]["choices"][0]["message"]["content"]
    assert len(full) >= 6
    stop = full[3:5]
    cut = full[: full.find(stop)]
    body = c.json("POST", "/v1/chat/completions", {**CHAT, "stop": [stop, "never-there"]})[1]
    assert body["choices"][0]["message"]["content"] == cut and body["choices"][0]["finish_reason"] == "stop"
    events = c.stream("/v1/chat/completions", {**CHAT, "stop": stop})
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == cut


def test_n_choices_in_one_batch(server) -> None:
    c = Client(server)
    body = c.json("POST", "/v1/chat/completions", {**CHAT, "n": 3, "seed": 10})[1]
    texts = [ch["message"]["content"] for ch in body["choices"]]
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
    for i in range(3):  # choice i is the answer for seed 10 + i
        single = c.json("POST", "/v1/chat/completions", {**CHAT, "seed": 10 + i})[1]
        assert single["choices"][0]["message"]["content"] == texts[i]
    # streamed choices are the same answers as the same batch unstreamed (a batch of another size
    # may round differently in llama.cpp's batched matmuls, so n=2 is compared with n=2)
    pair = [ch["message"]["content"] for ch in
            c.json("POST", "/v1/chat/completions", {**CHAT, "n": 2, "seed": 10})[1]["choices"]]
    events = c.stream("/v1/chat/completions", {**CHAT, "n": 2, "seed": 10})
    for i in range(2):
        got = "".join(e["choices"][0]["delta"].get("content", "") for e in events
                      if e["choices"] and e["choices"][0]["index"] == i)
        assert got == pair[i]


def test_completions_echo_and_suffix_infill(server, engine) -> None:
    c = Client(server)
    body = c.json("POST", "/v1/completions", {"prompt": "Halt, traveller!", "max_tokens": 8, "seed": 1,
                                              "echo": True})[1]
    assert body["object"] == "text_completion" and body["choices"][0]["text"].startswith("Halt, traveller!")
    assert body["usage"]["prompt_tokens"] == engine.encode("Halt, traveller!").size
    as_ids = c.json("POST", "/v1/completions", {"prompt": [int(t) for t in engine.encode("Halt, traveller!")],
                                                "max_tokens": 8, "seed": 1})[1]
    assert "Halt, traveller!" + as_ids["choices"][0]["text"] == body["choices"][0]["text"]
    infill = c.json("POST", "/v1/completions", {"prompt": "None may pass the", "suffix": " after dark.",
                                                "max_tokens": 3, "seed": 2})[1]
    choice = infill["choices"][0]
    assert choice["finish_reason"] == "length" and infill["usage"]["completion_tokens"] == 3
    events = c.stream("/v1/completions", {"prompt": "None may pass the", "suffix": " after dark.", "max_tokens": 3,
                                          "seed": 2})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == choice["text"]


def test_infill_endpoint(server) -> None:
    c = Client(server)
    req = {"template": "Halt, {player}! None may pass the {___:2} after dark.", "variables": {"player": "Aria"},
           "character": "gate_guard", "context": "gate_night", "n": 2, "seed": 5}
    status, body = c.json("POST", "/v1/infill", req)
    assert status == 200, body
    assert body["object"] == "dgchat.infill" and body["character"] == "gate_guard"
    for i, choice in enumerate(body["choices"]):
        assert choice["index"] == i and choice["seed"] == 5 + i and choice["finish_reason"] == "stop"
        assert choice["text"] == f"Halt, Aria! None may pass the {choice['holes'][0]['text']} after dark."
        assert choice["holes"][0]["tokens"] == 2
    assert body["usage"]["completion_tokens"] == 4
    inline = {**req, "character": {"name": "Captain Brann", "role": "the night captain"}, "n": 1}
    assert c.json("POST", "/v1/infill", inline)[1]["choices"][0] == body["choices"][0]  # the same card, inline
    _error(*c.json("POST", "/v1/infill", {**req, "variables": {}}), 400, "invalid_parameter")
    _error(*c.json("POST", "/v1/infill", {**req, "character": "nobody"}), 400)
    _error(*c.json("POST", "/v1/infill", {**req, "template": "no hole"}), 400, param="template")
    _error(*c.json("POST", "/v1/infill", {**req, "colour": 1}), 400, param="colour")
    _error(*c.json("POST", "/v1/infill", {**req, "character": {"nme": "x"}}), 400)


@pytest.mark.parametrize("body, status, code, param", [
    ({"messages": []}, 400, None, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, None, "messages[0].role"),
    ({**CHAT, "temperature": 5}, 400, None, "temperature"),
    ({**CHAT, "top_p": 0}, 400, None, "top_p"),
    ({**CHAT, "n": 0}, 400, None, "n"),
    ({**CHAT, "max_tokens": "many"}, 400, None, "max_tokens"),
    ({**CHAT, "max_tokens": 2048}, 400, "context_length_exceeded", "max_tokens"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400, None, "stop"),
    ({**CHAT, "tools": [{"type": "function"}]}, 400, "unsupported_parameter", "tools"),
    ({**CHAT, "logprobs": True}, 400, "unsupported_parameter", "logprobs"),
    ({**CHAT, "presence_penalty": 0.5}, 400, "unsupported_parameter", "presence_penalty"),
    ({**CHAT, "logit_bias": {"999999": 1}}, 400, None, "logit_bias"),
    ({**CHAT, "dgchat": {"stepz": 3}}, 400, None, "dgchat.stepz"),
    ({**CHAT, "dgchat": {"steps": 0}}, 400, "invalid_parameter", None),
    ({**CHAT, "seed": -1}, 400, None, "seed"),
    ([1, 2], 400, None, None),
])
def test_bad_requests_get_openai_errors(server, body, status: int, code: str | None, param: str | None) -> None:
    _error(*Client(server).json("POST", "/v1/chat/completions", body), status, code, param)


def test_protocol_errors(server) -> None:
    c = Client(server)
    _error(*c.json("POST", "/v1/chat/completions", raw=b"{not json"), 400, "invalid_json")
    _error(*c.json("POST", "/v1/chat/completions", CHAT, headers={"Content-Type": "text/plain"}), 415)
    _error(*c.json("POST", "/v1/nope", {"x": 1}), 404, "not_found")
    status, headers, data = c.request("GET", "/v1/chat/completions")
    _error(status, json.loads(data), 405, "method_not_allowed")
    assert headers["allow"] == "POST"
    status, headers, data = c.request("POST", "/v1/chat/completions", raw=b"x" * (64 * 1024 + 1))
    _error(status, json.loads(data), 413, "request_too_large")
    assert headers["connection"] == "close"
    # the connection (re-opened by http.client after the close) still serves
    assert c.json("GET", "/health")[0] == 200
    # a raw socket: a garbage request line, then headers that never end
    with socket.create_connection(server.server.address, timeout=10) as s:
        s.sendall(b"HELLO\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400 ")
    with socket.create_connection(server.server.address, timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nX: " + b"a" * 70000)
        assert s.recv(4096).startswith(b"HTTP/1.1 431 ")


def test_keep_alive_serves_several_requests_on_one_connection(server) -> None:
    with socket.create_connection(server.server.address, timeout=10) as s:
        f = s.makefile("rb")
        for _ in range(3):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert f.readline().startswith(b"HTTP/1.1 200 ")
            length = 0
            while (line := f.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            assert json.loads(f.read(length))["status"] == "ok"


def test_concurrent_clients_get_their_own_answers(server) -> None:
    seeds = [21, 22, 23, 24]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(seed: int) -> None:
        try:
            c = Client(server)
            if seed % 2:
                events = c.stream("/v1/chat/completions", {**CHAT, "seed": seed})
                results[seed] = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
            else:
                results[seed] = c.json("POST", "/v1/chat/completions", {**CHAT, "seed": seed})[1]["choices"][0][
                    "message"]["content"]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and sorted(results) == seeds
    c = Client(server)
    for seed in seeds:  # one after another: the same answers
        assert c.json("POST", "/v1/chat/completions", {**CHAT, "seed": seed})[1]["choices"][0]["message"][
            "content"] == results[seed]


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def _send_raw(address, body: dict, path: str = "/v1/chat/completions") -> socket.socket:
    s = socket.create_connection(address, timeout=60)
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _read_status(s: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ")[1])


def test_queue_limit_and_disconnects(engine, monkeypatch) -> None:
    """One request runs, max_queue wait, the next one gets 429 at once; a client that hangs up while
    queued is never generated for."""
    calls = []
    real = openai_api.run_plan
    monkeypatch.setattr(openai_api, "run_plan", lambda plan, *a: calls.append(plan.seed) or real(plan, *a))
    with ServerThread(engine, ServeConfig(port=0, quiet=True, max_queue=1)) as st:
        status = st.server.service.status
        engine._lock.acquire()  # the worker will block inside the engine: the first request stays running
        try:
            running = _send_raw(st.server.address, {**CHAT, "seed": 1})
            _wait(lambda: status()["running"] == 1)
            gone = _send_raw(st.server.address, {**CHAT, "seed": 2})
            _wait(lambda: status()["queued"] == 1)
            s, body = Client(st).json("POST", "/v1/chat/completions", {**CHAT, "seed": 3})
            _error(s, body, 429, "queue_full")
            gone.close()  # hangs up while queued: its place in the queue is free at once
            _wait(lambda: status()["queued"] == 0)
            queued = _send_raw(st.server.address, {**CHAT, "seed": 4})
            _wait(lambda: status()["queued"] == 1)
        finally:
            engine._lock.release()
        assert _read_status(running) == 200 and _read_status(queued) == 200
        running.close()
        queued.close()
        _wait(lambda: status() == {"running": 0, "queued": 0, "max_queue": 1})
        assert calls == [1, 4]  # nothing was generated for the client that hung up


def test_token_and_host_rules(engine) -> None:
    with pytest.raises(InvalidParameterError, match="not a loopback address"):
        ServeConfig(host="0.0.0.0").validate()
    with pytest.raises(InvalidParameterError, match="at least 8"):
        ServeConfig(token="short").validate()
    ServeConfig(host="::1").validate()
    ServeConfig(host="localhost").validate()
    with ServerThread(engine, ServeConfig(port=0, quiet=True, token="s3cret-token")) as st:
        status, headers, data = Client(st).request("GET", "/v1/models")
        _error(status, json.loads(data), 401, "invalid_api_key")
        assert headers["www-authenticate"].startswith("Bearer")
        _error(*Client(st, token="wrong-token").json("GET", "/v1/models"), 401)
        _error(*Client(st, token="wrong-token").json("POST", "/v1/nope", {}), 401)  # no route probing either
        assert Client(st, token="s3cret-token").json("GET", "/v1/models")[0] == 200


def test_graceful_shutdown_answers_in_flight_requests(engine) -> None:
    st = ServerThread(engine, ServeConfig(port=0, quiet=True)).start()
    address = st.server.address
    status = st.server.service.status
    engine._lock.acquire()
    try:
        running = _send_raw(address, {**CHAT, "seed": 1})
        _wait(lambda: status()["running"] == 1)
        queued = _send_raw(address, {**CHAT, "seed": 2, "stream": True})
        _wait(lambda: status()["queued"] == 1)
        stopper = threading.Thread(target=st.stop)
        stopper.start()
        time.sleep(0.2)
    finally:
        engine._lock.release()
    stopper.join(30)
    assert _read_status(running) == 503 and _read_status(queued) == 503
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=2)


def test_http_10_streams_until_close_and_connection_cap(engine) -> None:
    with ServerThread(engine, ServeConfig(port=0, quiet=True, max_connections=2)) as st:
        body = json.dumps({**CHAT, "stream": True}).encode()
        with socket.create_connection(st.server.address, timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, payload = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"chunked" not in head.lower()
        assert payload.startswith(b"data: {") and payload.endswith(b"data: [DONE]\n\n")
        # two idle connections fill the server; a third is told to come back later
        a = socket.create_connection(st.server.address, timeout=10)
        b = socket.create_connection(st.server.address, timeout=10)
        try:
            a.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert a.recv(4096).startswith(b"HTTP/1.1 200 ")
            b.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert b.recv(4096).startswith(b"HTTP/1.1 200 ")
            with socket.create_connection(st.server.address, timeout=10) as c:
                assert c.recv(4096).startswith(b"HTTP/1.1 503 ")
        finally:
            a.close()
            b.close()
