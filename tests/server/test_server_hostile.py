"""`dgchat serve` against hostile and malformed input, over real sockets to a real uvicorn server:
bad HTTP framing, slow clients, DNS rebinding and cross-site pages, JSON that Python reads but a
client never meant (NaN, 1e999, 5,000-digit integers), unbounded `dgchat` settings, terminal
escapes aimed at the log, and a seeded fuzz over a few hundred mutated API bodies. Every case is
a 4xx (named field where there is one) within seconds, never a 5xx or a hang."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.params import MAX_STEPS
from dgchat.server.app import ServeConfig, ServerThread

CHAT = {"messages": [{"role": "user", "content": "Who goes there?"}], "max_tokens": 8, "seed": 3}


@pytest.fixture(scope="module")
def engine(llada_gguf: Path) -> Iterator[DiffusionEngine]:
    with load_engine(llada_gguf, n_threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    with ServerThread(engine, ServeConfig(port=0, quiet=True, max_body=64 * 1024)) as st:
        yield st


def _raw(address, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, read until the server closes (or answers and goes quiet)."""
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and _complete(out):
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return out


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _status(data: bytes) -> int:
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    return int(data.split(b" ")[1])


def _json_error(data: bytes) -> dict:
    err = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def _post(address, body: bytes, headers: dict | None = None, path: str = "/v1/chat/completions",
          timeout: float = 30.0) -> tuple[int, dict, float]:
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    return resp.status, json.loads(data), time.monotonic() - t0


def _healthy(st: ServerThread) -> None:
    conn = http.client.HTTPConnection(*st.server.address, timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()


# -- HTTP framing -------------------------------------------------------------------------------------

H = b"Host: 127.0.0.1\r\n"


@pytest.mark.parametrize("request_bytes, status", [
    # a Unicode superscript two passes str.isdigit(); h11 takes ASCII digits only
    (b"POST /v1/chat/completions HTTP/1.1\r\n" + H + "Content-Length: \u00b2\r\n\r\nxx".encode(), 400),
    # conflicting lengths: the request-smuggling shape
    (b"POST /v1/chat/completions HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n{}", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\n" + H + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\n" + H + b"Content-Length: -1\r\n\r\n", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411),
    (b"POST /v1/chat/completions HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}",
     411),
    (b"HELLO\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
    (b"GET /health HTTP/1.1\r\n" + H + H + b"\r\n", 400),
    (b"GET /health HTTP/1.1\r\n" + H + b"X : y\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\n" + H + b"X: a\x00b\r\n\r\n", 400),
    (b"GET /he\x1balth HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET /health HTTP/1.1\r\n" + H + b"X: " + b"a" * 40000 + b"\r\n\r\n", 431),
    (b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\n" + H + b"\r\n", 431),
    (b"GET /health HTTP/1.1\r\n" + H + b"X: " + b"a" * 40000, 431),  # never ends
], ids=["unicode-digit-length", "conflicting-lengths", "5000-digit-length", "negative-length", "chunked",
        "chunked-and-length", "garbage-request-line", "no-host", "two-hosts", "space-before-colon", "nul-in-header",
        "escape-in-target", "long-header", "long-target", "endless-header"])
def test_malformed_requests_get_a_4xx(server, request_bytes: bytes, status: int) -> None:
    data = _raw(server.server.address, request_bytes)
    assert _status(data) == status, data[:300]
    _json_error(data)
    _healthy(server)


def test_a_body_shorter_than_its_length_is_timed_out_not_a_500(engine) -> None:
    with ServerThread(engine, ServeConfig(port=0, quiet=True, body_timeout=1.0)) as st:
        t0 = time.monotonic()
        data = _raw(st.server.address, b"POST /v1/chat/completions HTTP/1.1\r\n" + H +
                    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\"")
        assert _status(data) == 408 and time.monotonic() - t0 < 5
        assert _json_error(data)["code"] == "request_timeout"
        _healthy(st)


def test_slow_loris_is_closed_by_the_head_deadline(engine) -> None:
    """A client that sends a byte a second never completes its head: the connection is answered
    408 and closed at the deadline, however steadily the bytes arrive; one that sends nothing is
    closed too. Other clients are served meanwhile."""
    with ServerThread(engine, ServeConfig(port=0, quiet=True, header_timeout=2.0)) as st:
        slow = socket.create_connection(st.server.address, timeout=10)
        idle = socket.create_connection(st.server.address, timeout=10)
        t0 = time.monotonic()
        received = b""
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 20:
                _healthy(st)  # the server keeps serving everyone else
                try:
                    slow.sendall(bytes([byte]))
                except OSError:  # closed under us: that is the point
                    break
                slow.settimeout(1.0)
                try:
                    chunk = slow.recv(4096)
                except TimeoutError:
                    continue
                received += chunk
                if not chunk or b"\r\n\r\n" in received:
                    break
            closed_after = time.monotonic() - t0
            assert received.startswith(b"HTTP/1.1 408 "), received
            assert closed_after < 5, closed_after
            slow.settimeout(5)
            try:
                while slow.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            idle.settimeout(5)
            assert idle.recv(4096) == b""  # nothing sent, nothing answered: just closed
            assert time.monotonic() - t0 < 8
        finally:
            slow.close()
            idle.close()


def test_the_deadline_also_covers_keep_alive_and_pipelined_heads(engine) -> None:
    """After a response the next head has the same deadline: trickling it does not restart it."""
    with ServerThread(engine, ServeConfig(port=0, quiet=True, header_timeout=1.5)) as st:
        with socket.create_connection(st.server.address, timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\n" + H + b"\r\n")
            first = b""
            while not (b"\r\n\r\n" in first and _complete(first)):
                first += s.recv(4096)
            assert first.startswith(b"HTTP/1.1 200 ")
            t0 = time.monotonic()
            got = b""
            for byte in b"GET /health HTTP/1.1\r\n" + H + b"X: " + b"b" * 30:
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    break
                s.settimeout(0.5)
                try:
                    got += s.recv(4096)
                except TimeoutError:
                    continue
                if b"\r\n\r\n" in got:
                    break
            assert got.startswith(b"HTTP/1.1 408 ") and time.monotonic() - t0 < 4


# -- request bodies ----------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, param_or_message", [
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "NaN"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', "Infinity"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}', "Infinity"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', "out of range"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "dgchat": {"cfg_scale": NaN}}', "NaN"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "dgchat": {"entropy_bound": Infinity}}', "Infinity"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}", "digits"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": -' + b"9" * 4400 + b"}", "digits"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
    (b"[" * 30000 + b"]" * 30000, "nested"),
    (b'{"messages": "\xff\xfe"}', "UTF-8"),
    (b'{"messages": [}', "not valid JSON"),
])
def test_json_that_is_not_what_a_client_meant_is_a_400(server, raw: bytes, param_or_message: str) -> None:
    status, body, elapsed = _post(server.server.address, raw)
    assert status == 400 and body["error"]["code"] == "invalid_json", body
    assert param_or_message in body["error"]["message"]
    assert elapsed < 5


@pytest.mark.parametrize("headers, status", [
    ({"Content-Type": ""}, 415),
    ({"Content-Type": "text/plain"}, 415),  # what a page can send cross-site without a preflight
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
    ({"Content-Type": "application/json; charset=utf-8"}, 200),
])
def test_content_type_must_be_json(server, headers: dict, status: int) -> None:
    body = json.dumps(CHAT).encode()
    if headers["Content-Type"] == "":  # no Content-Type header at all
        data = _raw(server.server.address, b"POST /v1/chat/completions HTTP/1.1\r\n" + H +
                    b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert _status(data) == status and _json_error(data)["code"] == "unsupported_media_type"
        return
    got, answer, _ = _post(server.server.address, body, headers)
    assert got == status, answer


@pytest.mark.parametrize("field, value, param", [
    ("steps", 1_000_000_000_000, "dgchat.steps"),
    ("steps", MAX_STEPS + 1, "dgchat.steps"),
    ("steps", True, "dgchat.steps"),
    ("steps", 2.5, "dgchat.steps"),
    ("gen_length", 10**9, "dgchat.gen_length"),
    ("block_length", 10**9, "dgchat.block_length"),
    ("top_k", 10**9, "dgchat.top_k"),
    ("cfg_scale", 1e300, "dgchat.cfg_scale"),
    ("cfg_scale", -1, "dgchat.cfg_scale"),
    ("alg_temp", 1e308, "dgchat.alg_temp"),
    ("alg_temp", 1e-6, "dgchat.alg_temp"),  # every weight but one underflows: the draw would fail
    ("factor", 0, "dgchat.factor"),
    ("threshold", 0, "dgchat.threshold"),
    ("eps", 1, "dgchat.eps"),
    ("entropy_bound", 0, "dgchat.entropy_bound"),
    ("entropy_bound", 1e307, "dgchat.entropy_bound"),
    ("t_min", 1e9, "dgchat.t_min"),
    ("t_max", -1, "dgchat.t_max"),
    ("pad_bias", -101, "dgchat.pad_bias"),
    ("pad_bias", "-1", "dgchat.pad_bias"),
    ("algorithm", "fastest", "dgchat.algorithm"),
    ("cache", 3, "dgchat.cache"),
    ("canvas", 1, "dgchat.canvas"),
])
def test_every_dgchat_setting_is_bounded(server, field: str, value, param: str) -> None:
    status, body, elapsed = _post(server.server.address, json.dumps({**CHAT, "dgchat": {field: value}}).encode())
    assert status == 400 and body["error"]["param"] == param, body
    assert elapsed < 5


@pytest.mark.parametrize("patch, param", [
    ({"logit_bias": {"\uff11\uff12": 1}}, "logit_bias"),  # fullwidth digits: int() would take them
    ({"logit_bias": {" 12": 1}}, "logit_bias"),
    ({"logit_bias": {"1_2": 1}}, "logit_bias"),
    ({"logit_bias": {"1" * 30: 1}}, "logit_bias"),
    ({"stop": "x" * 513}, "stop"),
    ({"messages": [{"role": "user", "content": ""}] * 2049}, "messages"),
    ({"max_tokens": 10**18}, "max_tokens"),
    ({"seed": 2**64}, "seed"),
    ({"top_p": 1e-300}, "top_p"),  # 0 in the sampler's float32
    ({"n": 10**6}, "n"),
])
def test_lengths_and_integers_are_parsed_strictly(server, patch: dict, param: str) -> None:
    raw = json.dumps({**CHAT, **patch}, separators=(",", ":")).encode()
    status, body, elapsed = _post(server.server.address, raw)
    assert status == 400 and body["error"]["param"] == param, body
    assert elapsed < 5


def test_completions_prompt_token_list_over_the_context(server, engine) -> None:
    tokens = [1] * (int(engine.n_ctx_max) + 1)
    status, body, _ = _post(server.server.address, json.dumps({"prompt": tokens, "max_tokens": 4}).encode(),
                            path="/v1/completions")
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


# -- Host and Origin ---------------------------------------------------------------------------------

def _get(address, headers: dict, path: str = "/health", method: str = "GET") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(*address, timeout=10)
    conn.putrequest(method, path, skip_host=True)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.endheaders()
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def test_dns_rebinding_and_cross_site_pages_are_refused(server) -> None:
    address = server.server.address
    port = address[1]
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "[::1]", f"[::1]:{port}"):
        assert _get(address, {"Host": host})[0] == 200, host
    # a page at http://evil.example:PORT whose name now resolves to 127.0.0.1
    status, _, data = _get(address, {"Host": f"evil.example:{port}"})
    assert status == 403 and json.loads(data)["error"]["code"] == "host_not_allowed"
    assert _get(address, {"Host": "127.0.0.1:x"})[0] == 400
    # a cross-site page: browsers send Origin, programs do not
    status, headers, data = _get(address, {"Host": "127.0.0.1", "Origin": "http://evil.example"})
    assert status == 403 and json.loads(data)["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in headers
    assert _get(address, {"Host": "127.0.0.1", "Origin": "null"})[0] == 403
    # and a POST with a body is refused before the body is read (the connection closes)
    status, headers, _ = _get(address, {"Host": "127.0.0.1", "Origin": "http://evil.example",
                                        "Content-Type": "text/plain", "Content-Length": "5"},
                              path="/v1/chat/completions", method="POST")
    assert status == 403 and headers["connection"] == "close"


def test_allowed_hosts_and_origins(engine) -> None:
    config = ServeConfig(port=0, quiet=True, allow_hosts=("mybox.lan",), allow_origins=("http://localhost:3000",))
    with ServerThread(engine, config) as st:
        address = st.server.address
        assert _get(address, {"Host": "mybox.lan:8765"})[0] == 200
        assert _get(address, {"Host": "other.lan"})[0] == 403
        status, headers, _ = _get(address, {"Host": "127.0.0.1", "Origin": "http://localhost:3000"})
        assert status == 200 and headers["access-control-allow-origin"] == "http://localhost:3000"
        # the browser's preflight for a JSON POST with a token
        status, headers, _ = _get(address, {"Host": "127.0.0.1", "Origin": "http://localhost:3000",
                                            "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "authorization, content-type"},
                                  path="/v1/chat/completions", method="OPTIONS")
        assert status == 200 and "POST" in headers["access-control-allow-methods"]
        assert _get(address, {"Host": "127.0.0.1", "Origin": "http://localhost:3001"})[0] == 403


def test_origin_and_host_options_are_checked() -> None:
    from dgchat.model_backend.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="--token"):
        ServeConfig(allow_origins=("*",)).validate()
    with pytest.raises(InvalidParameterError, match="origin such as"):
        ServeConfig(allow_origins=("localhost:3000",)).validate()
    with pytest.raises(InvalidParameterError, match="printable ASCII"):
        ServeConfig(token="has a space in it").validate()
    ServeConfig(allow_origins=("*",), token="s3cret-token").validate()


# -- the log ------------------------------------------------------------------------------------------

def test_the_access_log_escapes_what_clients_send(engine, capsys) -> None:
    with ServerThread(engine, ServeConfig(port=0, quiet=False)) as st:
        capsys.readouterr()
        _raw(st.server.address, b"GET /%1b[31mred%0aforged%20line%e2%80%ae HTTP/1.1\r\n" + H + b"\r\n")
        _raw(st.server.address, b"GET /x HTTP/1.1\r\nHost: \x1b[31mevil\r\n\r\n")
        _raw(st.server.address, b"GET /a\x1b[2J HTTP/1.1\r\n" + H + b"\r\n")
        with socket.create_connection(st.server.address) as s:  # hangs up in the middle of its body
            s.sendall(b"POST /v1/completions HTTP/1.1\r\n" + H + b"Content-Type: application/json\r\n"
                      b"Content-Length: 50\r\n\r\n{\"prompt\"")
            time.sleep(0.2)
        time.sleep(0.2)
        err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err
    lines = err.splitlines()
    assert len(lines) == 4, lines
    assert "GET /%1b[31mred%0aforged%20line%e2%80%ae 404" in lines[0]  # the path as sent
    assert " 403 " in lines[1] and "400 malformed HTTP request" in lines[2] and "\\x1b" in lines[2]
    assert "POST /v1/completions 499" in lines[3]


# -- fuzz ---------------------------------------------------------------------------------------------

_HOSTILE = [None, True, False, 0, -1, 1, 2**31, 2**63, 10**19, -(10**19), 0.5, -0.0, 1e308, -1e308, 1e-320, "",
            "x", "0", "１", "\x00", "\ud800", "\u202e", "a" * 3000, [], [1], [[[]]], {}, {"a": 1}, [None] * 50,
            "NaN", "__NAN__", "__INF__", "__BIGINT__"]
_FIELDS = ["messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "seed", "stop", "stream",
           "stream_options", "logit_bias", "dgchat", "prompt", "suffix", "echo", "best_of", "tools", "logprobs",
           "response_format", "template", "variables", "character", "max_attempts", "context"]
_DGCHAT = ["steps", "gen_length", "block_length", "algorithm", "alg_temp", "threshold", "factor", "cfg_scale",
           "top_k", "eps", "cache", "canvas", "entropy_bound", "t_min", "t_max", "pad_bias"]
_BASES = {
    "/v1/chat/completions": {**CHAT, "dgchat": {"steps": 4}},
    "/v1/completions": {"prompt": "Halt, traveller!", "max_tokens": 4, "seed": 1},
    "/v1/infill": {"template": "Halt, {player}! None may pass the {___:2} after dark.", "variables": {"player": "A"},
                   "seed": 5},
}


def _mutate(rng: random.Random, body: dict) -> bytes:
    body = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        choice = rng.random()
        if choice < 0.4:
            body[rng.choice(_FIELDS)] = rng.choice(_HOSTILE)
        elif choice < 0.7:
            ext = body.setdefault("dgchat", {})
            if isinstance(ext, dict):
                ext[rng.choice(_DGCHAT)] = rng.choice(_HOSTILE)
        elif choice < 0.8 and body:
            body.pop(rng.choice(sorted(body)))
        elif "messages" in body and isinstance(body["messages"], list) and body["messages"]:
            body["messages"][0] = rng.choice([{"role": rng.choice(["user", "tool", 3, None]),
                                               "content": rng.choice(_HOSTILE)}, rng.choice(_HOSTILE)])
    text = json.dumps(body, allow_nan=True)
    text = (text.replace('"__NAN__"', "NaN").replace('"__INF__"', "-Infinity")
            .replace('"__BIGINT__"', "1" + "0" * 4400))
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:  # byte-level damage: truncation, a flipped byte, a stray character
        k = rng.randrange(len(raw))
        raw = rng.choice([raw[:k], raw[:k] + bytes([rng.randrange(256)]) + raw[k + 1:], raw[:k] + b"\x00" + raw[k:]])
    return raw


def test_fuzzed_api_bodies_never_get_a_5xx_or_hang(engine, monkeypatch) -> None:
    """300 seeded mutations of valid bodies for the three generation routes. Generations that the
    mutation made valid run for real, cut off after 0.5 s (a cancelled request is a 499) so the
    test's time stays bounded; everything else must be a 4xx within 5 s."""
    def capped(method):
        def run(*args, cancel, **kwargs):
            timer = threading.Timer(0.5, cancel.set)
            timer.start()
            try:
                yield from method(*args, cancel=cancel, **kwargs)
            finally:
                timer.cancel()
        return run

    monkeypatch.setattr(engine, "generate", capped(engine.generate))
    monkeypatch.setattr(engine, "generate_batch", capped(engine.generate_batch))
    rng = random.Random(20240515)
    statuses: dict[int, int] = {}
    t_start = time.monotonic()
    with ServerThread(engine, ServeConfig(port=0, quiet=True, max_queue=2)) as st:
        for i in range(300):
            path = rng.choice(sorted(_BASES))
            raw = _mutate(rng, _BASES[path])
            conn = http.client.HTTPConnection(*st.server.address, timeout=10)
            t0 = time.monotonic()
            conn.request("POST", path, raw, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            elapsed = time.monotonic() - t0
            assert resp.status < 500, (i, path, raw[:300], data[:500])
            assert elapsed < 5, (i, path, raw[:300], elapsed)
            if resp.status >= 400:
                assert set(json.loads(data)["error"]) == {"message", "type", "param", "code"}
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
        _healthy(st)
    assert statuses.get(400, 0) > 100 and statuses.get(200, 0) > 10, statuses  # both paths were exercised
    assert time.monotonic() - t_start < 120
