"""dgchat.remote against a hostile server (issue 31): whatever a server sends, dgchat ends with one
line (`dgchat: error: ...` on the command line, a RemoteError in the engine) within a stated time
and memory, never a traceback, a hang or gigabytes.

The servers are real loopback HTTP servers (tests/fixtures/fake_openai.py, `Raw` replies written
piece by piece). The memory cases run the real command line in a child process and read that
child's peak RSS (its VmHWM at exit): an endless /v1/models body, a gzip bomb, a canvas
stream adding 20,000 token pieces a step, one showing new tokens every step, an 11 MB answer to
max_tokens 1024, an event that never ends. Their bodies are endless or far larger than the bound,
so what stops them is the bound itself (remote/limits.py), not the test running out of data.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures.fake_openai import FakeServer, Raw, Reply

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import DiffusionParams
from dgchat.remote import RemoteApiError, RemoteClient, RemoteEngine, RemoteError, RemoteTimeout, normalize_url
from dgchat.remote import limits
from dgchat.remote.pool import ServerPool

PEAK_RSS_MB = 600  # the bound for every probe
MESSAGES = [{"role": "user", "content": "Who goes there?"}]
FILE = {"file": "tiny-llada.gguf", "name": "dgchat tiny llada", "architecture": "llada", "size_bytes": 513600,
        "fingerprint": "sha256:201e75b4ba0a25e17f0a41584f70efc56ebbee754e08c9ee9c083a33ec46d307"}


def _dg_models(**details: Any) -> dict:
    """/v1/models as dgchat serve answers it for the tiny LLaDA test model (captured), with changes."""
    d = {"architecture": "llada", "context_length": 2048, "engine": "masked diffusion", "name": "dgchat tiny llada",
         "family": "masked", "uniform_state": False, "mask_token": 404, "end_tokens": [401, 403], "n_vocab": 405,
         "defaults": {"steps": 128, "gen_length": 128, "block_length": 32, "algorithm": "confidence", "eps": None,
                      "temperature": 0.0, "top_k": 0, "top_p": 1.0, "cfg_scale": 0.0, "max_tokens": 128,
                      "early_stop": True, "mode": "dgchat", "cache": "none", "sampler_on": "auto"},
         "model_defaults": {"steps": 128, "gen_length": 128, "block_length": 32, "algorithm": "confidence",
                            "temperature": 0.0},
         "has_kv_memory": False, "file": dict(FILE)}
    d.update(details)
    return {"object": "list", "data": [{"id": "tiny-llada", "object": "model", "created": 1, "owned_by": "dgchat",
                                        "dgchat": d}]}


VLLM_MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]}


def _chunk(text: str | None = None, finish: str | None = None, ext: dict | None = None) -> dict:
    c: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                         "choices": [{"index": 0, "delta": {} if text is None else {"content": text},
                                      "finish_reason": finish}]}
    if ext is not None:
        c["dgchat"] = ext
    return c


def _sse(obj: Any) -> bytes:
    return b"data: " + (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()) + b"\n\n"


def _frame(**changes: Any) -> dict:
    """One canvas step as dgchat serve sends it (server/openai_api.py _canvas_payload)."""
    frame = {"choice": 0, "step": 1, "total_steps": 8, "canvas_index": 0, "canvas": ["Halt", None],
             "state": [2, 0], "tokens": [10, 404], "canvas_step": 1, "committed": 1, "uniform_state": False,
             "elapsed_s": 0.1, "timing": {"model_ms": 1.0, "sampler_ms": 0.5}, "answer_length": 0,
             "answer_tokens": [], "answer_text": [], "special": [404]}
    frame.update(changes)
    return frame


FINAL = {"choice": 0, "final": True, "tokens": [10, 401], "stop_reason": "eos",
         "stats": {"steps": 1, "tokens": 1, "canvases": 1, "elapsed_s": 0.1}}


def _server(models: Any = VLLM_MODELS, stream: Any = None, infill: Any = None) -> FakeServer:
    """A server answering /v1/models, the completions and /v1/infill with the given replies: a
    JSON value, a Reply or Raw, or a function making one per request (fresh generators)."""

    def answer(value: Any, body: Any) -> Reply | Raw:
        if callable(value):
            value = value(body)
        return value if isinstance(value, (Reply, Raw)) else Reply(body=value)

    def handler(method: str, path: str, body: Any) -> Reply | Raw:
        if path == "/v1/models":
            return answer(models, body)
        if path in ("/v1/chat/completions", "/v1/completions") and stream is not None:
            return answer(stream, body)
        if path == "/v1/infill" and infill is not None:
            return answer(infill, body)
        return Reply(404, {"detail": "Not Found"})

    return FakeServer(handler)


def _events(*objs: Any) -> Callable[[Any], Raw]:
    return lambda body: Raw(headers={"Content-Type": "text/event-stream"}, body=[_sse(o) for o in objs])


def _endless(make: Callable[[int], bytes], *, content_type: str = "text/event-stream", head: bytes = b"",
             **headers: str) -> Callable[[Any], Raw]:
    """A reply that never ends: `head`, then make(0), make(1), ... for as long as the client reads."""
    def gen() -> Iterator[bytes]:
        if head:
            yield head
        i = 0
        while True:
            yield make(i)
            i += 1
    return lambda body: Raw(headers={"Content-Type": content_type, **headers}, body=gen())


# -- the command line in a child process: exit code, output, time, peak RSS ----------------------------

@dataclass
class Run:
    rc: int
    out: str
    err: str
    seconds: float
    peak_mb: float


# The command line as `python -m dgchat` runs it, plus a report of the process's own peak RSS at exit:
# VmHWM of /proc/self/status, the high-water mark of this process's memory. (The kernel's ru_maxrss
# of a child would not do: it starts from the RSS of the process it was forked from, pytest's.)
_BOOT = """
import atexit, os, runpy, sys
def _peak():
    with open('/proc/self/status') as f:
        kb = next(line.split()[1] for line in f if line.startswith('VmHWM:'))
    with open(os.environ['DGCHAT_TEST_PEAK'], 'w') as out:
        out.write(kb)
atexit.register(_peak)
sys.argv = ['dgchat', *sys.argv[1:]]
runpy.run_module('dgchat', run_name='__main__', alter_sys=True)
"""


def _cli(*args: str, timeout: float = 60) -> Run:
    """`dgchat ARGS` in a child process: its exit code, output, wall time and peak RSS (MB)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        peak = Path(folder) / "peak"
        start = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-c", _BOOT, *args], capture_output=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL,
                                  env={**os.environ, "COLUMNS": "200", "DGCHAT_TEST_PEAK": str(peak)})
        except subprocess.TimeoutExpired:
            raise AssertionError(f"dgchat {' '.join(args)} ran past {timeout} s") from None
        seconds = time.monotonic() - start
        assert peak.exists(), f"no peak RSS reported (killed?): {proc.stderr[-2000:]!r}"
        peak_mb = int(peak.read_text()) / 1024
    return Run(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"), seconds,
               peak_mb)


def _one_line_error(run: Run, pattern: str, *, seconds: float, memory: bool = True) -> str:
    """The run failed with exactly one `dgchat: error:` line matching `pattern`, in time (and memory)."""
    lines = run.err.strip().splitlines()
    assert run.rc == 2 and len(lines) == 1 and "Traceback" not in run.err, run.err[-3000:]
    line = lines[0]
    print(f"\n{run.seconds:5.1f} s {run.peak_mb:4.0f} MB peak RSS  {line[:150]}")  # pytest -s: the measurements
    assert line.startswith("dgchat: error: ") and re.search(pattern, line), line
    assert len(line) < 600 and "\x1b" not in line, line
    assert run.seconds < seconds, f"{run.seconds:.1f} s: {line}"
    if memory:
        assert run.peak_mb < PEAK_RSS_MB, f"peak RSS {run.peak_mb:.0f} MB: {line}"
    return line


def _generate(url: str, *extra: str) -> tuple[str, ...]:
    return ("generate", "--server", url, "--retries", "0", "-p", "hi", *extra)


# -- unbounded responses (child process, peak RSS) -------------------------------------------------

@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_an_endless_models_body_stops_at_its_bound(framing: str) -> None:
    """A /v1/models body without end (chunked), or one declaring 200 MB: read up to 4 MiB, then one line."""
    head = b'{"object": "list", "data": ['
    if framing == "chunked":
        models = _endless(lambda i: b" " * 65536, content_type="application/json", head=head)
    else:
        def models(body: Any) -> Raw:
            size = 200 * limits.MIB

            def gen() -> Iterator[bytes]:
                yield head
                for _ in range((size - len(head)) // 65536):
                    yield b" " * 65536
                yield b" " * ((size - len(head)) % 65536)
            return Raw(headers={"Content-Type": "application/json", "Content-Length": str(size)}, body=gen(),
                       chunked=False)
    with _server(models=models) as server:
        run = _cli(*_generate(server.url))
    _one_line_error(run, r"sent more than 4 MiB for /v1/models", seconds=20)


def _gzip_bomb(blocks: int) -> Iterator[bytes]:
    """A gzip body of `blocks` MiB of spaces in about 1 KB each (2000 blocks: 2 MB inflating to 2 GB).
    Each block is compressed after a full flush, so every one is the same bytes: built in milliseconds."""
    c = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    header = c.compress(b"")
    block = c.compress(b" " * limits.MIB) + c.flush(zlib.Z_FULL_FLUSH)
    end = c.flush()[:-8]  # the last (empty) deflate block; the trailer is ours, for all the blocks
    yield header
    crc = 0
    for _ in range(blocks):
        yield block
        crc = zlib.crc32(b" " * limits.MIB, crc)  # the trailer is reached only if the client reads it all
    yield end + crc.to_bytes(4, "little") + (blocks * limits.MIB % (1 << 32)).to_bytes(4, "little")


def test_the_gzip_bomb_is_counted_as_it_inflates() -> None:
    assert len(b"".join(b for _, b in zip(range(3), _gzip_bomb(2000)))) < 3000  # it is small on the wire
    sample = b"".join(_gzip_bomb(3))
    assert gzip.decompress(sample) == b" " * (3 * limits.MIB)  # and a valid gzip body
    bomb = lambda body: Raw(headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},  # noqa: E731
                            body=_gzip_bomb(2000))
    with _server(models=bomb) as server:
        run = _cli(*_generate(server.url))
    _one_line_error(run, r"sent more than 4 MiB for /v1/models", seconds=20)
    # the same in a stream: one event of spaces inflating without end
    stream = lambda body: Raw(headers={"Content-Type": "text/event-stream", "Content-Encoding": "gzip"},  # noqa: E731
                              body=_gzip_bomb(2000))
    with _server(models=VLLM_MODELS, stream=stream) as server:
        run = _cli(*_generate(server.url, "--max-tokens", "1024"))
    _one_line_error(run, r"sent an event larger than [\d.]+ MiB \(the bound for this request's answer\)", seconds=20)


def test_an_event_that_never_ends() -> None:
    with _server(stream=_endless(lambda i: b"a" * 65536, head=b"data: ")) as server:
        run = _cli(*_generate(server.url, "--max-tokens", "1024"))
    _one_line_error(run, r"sent an event larger than [\d.]+ MiB", seconds=20)


def test_a_canvas_of_20k_new_pieces_a_step(tmp_path: Path) -> None:
    """Each step a canvas of 20,000 positions, every one a token never seen before (asked for by
    --record, as --visual asks for it on a terminal)."""
    def frame(i: int) -> bytes:
        ids = list(range(i * 20000, (i + 1) * 20000))
        return _sse(_chunk(ext=_frame(tokens=ids, canvas=["piece"] * 20000, state=[1] * 20000, step=i + 1,
                                      special=[])))

    with _server(models=_dg_models(n_vocab=1 << 24), stream=_endless(frame)) as server:
        run = _cli(*_generate(server.url, "--max-tokens", "64", "--record", str(tmp_path / "a.cast")))
    _one_line_error(run, r"sent a canvas of 20000 positions for an answer of at most 64 tokens \(max_tokens\)",
                    seconds=20)


def test_new_tokens_every_step_fill_the_piece_cache_to_its_bound(tmp_path: Path) -> None:
    """Canvases within the request's budget, but of tokens never seen before at every step: the pieces
    the engine caches stop at limits.MAX_PIECES (canvases asked for by --record)."""
    n = 4096

    def frame(i: int) -> bytes:
        return _sse(_chunk(ext=_frame(tokens=list(range(i * n, (i + 1) * n)), canvas=["pc"] * n, state=[1] * n,
                                      step=i + 1, special=[])))

    with _server(models=_dg_models(n_vocab=1 << 24), stream=_endless(frame)) as server:
        run = _cli(*_generate(server.url, "--max-tokens", str(n), "--record", str(tmp_path / "a.cast")), timeout=90)
    _one_line_error(run, rf"showed more than {limits.MAX_PIECES} distinct tokens", seconds=60)


def test_an_11_mb_answer_to_max_tokens_1024() -> None:
    """Text far beyond 1024 tokens' worth (11 MB in 8 KB deltas), or more deltas than tokens."""
    big = _events(*[_chunk("x" * 8192) for _ in range(1400)], _chunk(None, "stop"), "[DONE]")
    with _server(stream=big) as server:
        run = _cli(*_generate(server.url, "--max-tokens", "1024"))
    _one_line_error(run, r"sent more than 266240 bytes of text for an answer of at most 1024 tokens", seconds=20)
    many = _endless(lambda i: _sse(_chunk("y")))
    with _server(stream=many) as server:
        run = _cli(*_generate(server.url, "--max-tokens", "1024"))
    _one_line_error(run, r"sent more than 1024 pieces of text for an answer of at most 1024 tokens", seconds=20)


# -- time: deadline, Retry-After -------------------------------------------------------------------

def test_a_drip_fed_or_stalled_stream_ends_at_the_deadline() -> None:
    """Bytes every 0.2 s forever (each read is in time, so only a deadline can end it), and a stream
    that stalls after its head with a per-read timeout far longer than the deadline."""
    def drip(i: int) -> bytes:
        time.sleep(0.2)
        return b": keep-alive\n"

    def stall(body: Any) -> Raw:
        def gen() -> Iterator[bytes]:
            yield _sse(_chunk("Halt"))
            time.sleep(30)
            yield b""
        return Raw(headers={"Content-Type": "text/event-stream"}, body=gen())

    for stream in (_endless(drip), stall):
        with _server(stream=stream) as server:
            client = RemoteClient(server.url, retries=0, timeout=300, deadline=1.0)
            start = time.monotonic()
            with pytest.raises(RemoteTimeout, match=r"did not finish answering /v1/chat/completions within 1 s "
                                                    r"\(--deadline\)$"):
                list(client.stream("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 16}))
            assert 0.9 < time.monotonic() - start < 3.5
            client.close()
    # a GET (a model list) drip-fed: the same deadline
    with _server(models=_endless(drip, content_type="application/json")) as server:
        client = RemoteClient(server.url, retries=0, deadline=0.5)
        start = time.monotonic()
        with pytest.raises(RemoteTimeout, match=r"within 0\.5 s \(--deadline\)"):
            client.models()
        assert time.monotonic() - start < 3
        client.close()


def test_the_command_line_s_deadline() -> None:
    with _server(stream=_endless(lambda i: (time.sleep(0.2), b": ping\n")[1])) as server:
        run = _cli(*_generate(server.url, "--deadline", "1"))
    _one_line_error(run, r"did not finish answering /v1/chat/completions within 1 s \(--deadline\)$", seconds=12,
                    memory=False)


def test_retry_after_is_capped_and_the_waits_are_bounded() -> None:
    """Retry-After: 999999 used to be 93 s of silence: each wait is now at most 5 s, 15 s in all."""
    busy = Reply(503, {"error": {"message": "busy"}}, headers={"Retry-After": "999999"})
    for retries, expected in ((3, [5.0, 5.0, 5.0]), (10, [5.0, 5.0, 5.0])):
        slept: list[float] = []
        with _server(models=busy) as server:
            client = RemoteClient(server.url, retries=retries, sleep=slept.append)
            with pytest.raises(RemoteApiError, match=r"answered 503: busy$"):
                client.models()
            assert slept == expected and sum(slept) <= limits.MAX_RETRY_WAIT
            assert len(server.requests) == len(expected) + 1  # the wait budget, not the count, ended it
            client.close()
    slept = []
    with _server(models=Reply(503, {"error": {"message": "busy"}})) as server:  # backoff 0.5, 1, 2, 4, 8 -> cut
        client = RemoteClient(server.url, retries=10, sleep=slept.append)
        with pytest.raises(RemoteApiError):
            client.models()
        assert slept == [0.5, 1.0, 2.0, 4.0, 7.5] and sum(slept) == limits.MAX_RETRY_WAIT
        client.close()


# -- one line, not a traceback ---------------------------------------------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_deep_json_everywhere_is_one_line() -> None:
    raw_deep = lambda body: Raw(headers={"Content-Type": "application/json"}, body=[DEEP])  # noqa: E731
    with _server(models=raw_deep) as server:
        run = _cli(*_generate(server.url))
    _one_line_error(run, r"/v1/models answered something that is not valid JSON: it is nested more than 64 levels",
                    seconds=20, memory=False)
    events = lambda body: Raw(headers={"Content-Type": "text/event-stream"},  # noqa: E731
                              body=[b"data: " + DEEP + b"\n\n"])
    with _server(stream=events) as server, RemoteEngine.connect(server.url, retries=0) as engine:
        with pytest.raises(RemoteApiError, match=r"sent an event that is not valid JSON: it is nested more than 64 "
                                                 r"levels deep$"):
            list(engine.generate(engine.chat_prompt(MESSAGES), DiffusionParams(max_tokens=1024)))
    # deep, but within Python's own recursion limit: still refused (nothing later recurses on it)
    medium = b"[" * 500 + b"]" * 500
    with _server(models=_dg_models(), infill=lambda body: Raw(headers={"Content-Type": "application/json"},
                                                                 body=[DEEP])) as server:
        with RemoteEngine.connect(server.url, retries=0) as engine:
            with pytest.raises(RemoteApiError, match=r"/v1/infill answered something that is not valid JSON: it is "
                                                     r"nested more than 64 levels deep$"):
                engine.infill({"length": "bark"})
    with _server(models=lambda body: Raw(headers={"Content-Type": "application/json"}, body=[medium])) as server:
        with pytest.raises(RemoteApiError, match="nested more than 64 levels deep"):
            RemoteClient(server.url, retries=0).models()


@pytest.mark.parametrize("details, message", [
    ({"end_tokens": [2 ** 40]}, r"`data\[0\]\.dgchat\.end_tokens\[0\]` must be a token id in 0\.\.404 "
                                r"\(got 1099511627776\)"),
    ({"n_vocab": 2 ** 40}, r"`data\[0\]\.dgchat\.n_vocab` must be an integer in 1\.\.16777216"),
    ({"mask_token": "x"}, r"`data\[0\]\.dgchat\.mask_token` must be an integer"),
    ({"context_length": -1}, r"`data\[0\]\.dgchat\.context_length` must be an integer in 1\.\."),
    ({"defaults": {"logit_bias": 5}}, r"`data\[0\]\.dgchat\.defaults\.logit_bias` must be a list"),
    ({"defaults": {"logit_bias": [[1, 1e300]]}}, r"logit_bias values must be numbers in \[-100, 100\]"),
    ({"defaults": {"steps": 2 ** 40}}, r"`data\[0\]\.dgchat\.defaults\.steps`: --steps must be at most 8192"),
    ({"defaults": {"temperature": "hot"}}, r"--temperature must be a finite number"),
    ({"model_defaults": {"algorithm": ["x"]}}, r"--algorithm must be one of"),
    ({"uniform_state": "yes"}, r"`data\[0\]\.dgchat\.uniform_state` must be true or false"),
    ({"name": "n" * 5000}, r"`data\[0\]\.dgchat\.name` is 5000 characters long \(at most 1024\)"),
    ({"file": {"file": "x"}}, r"`data\[0\]\.dgchat\.file\.name` is missing"),
])
def test_out_of_range_model_fields(details: dict, message: str) -> None:
    with _server(models=_dg_models(**details)) as server:
        with pytest.raises(RemoteApiError, match=rf"^{re.escape(server.url)} sent an invalid /v1/models answer: "
                                                 rf".*{message}") as info:
            RemoteEngine.connect(server.url, retries=0)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_numbers_json_cannot_hold() -> None:
    """1e400 (inf), 10**30 (31 digits), NaN: refused while parsing, before any field is read."""
    for text, message in ((b'{"object": "list", "data": [], "seed": 1e400}', "the number 1e400 is out of range"),
                          (b'{"data": [' + b"1" + b"0" * 30 + b"]}", "an integer has 31 digits"),
                          (b'{"data": [NaN]}', "NaN is not a JSON number")):
        with _server(models=lambda body, t=text: Raw(headers={"Content-Type": "application/json"}, body=[t])) as s:
            with pytest.raises(RemoteApiError, match=re.escape(message)):
                RemoteClient(s.url, retries=0).models()
    seeds = {"choices": [{"index": 0, "seed": 10 ** 30}]}
    with _server(models=_dg_models(), infill=lambda body: Raw(
            headers={"Content-Type": "application/json"},
            body=[json.dumps(seeds).encode().replace(b"1" + b"0" * 30, b"1e400")])) as server:
        with RemoteEngine.connect(server.url, retries=0) as engine:
            with pytest.raises(RemoteApiError, match="the number 1e400 is out of range"):
                engine.infill({"length": "bark"})


def _canvas_run(url: str, **params: Any) -> list:
    with RemoteEngine.connect(url, retries=0) as engine:
        return list(engine.generate(engine.chat_prompt(MESSAGES), DiffusionParams(seed=1, max_tokens=16, **params)))


def test_a_good_canvas_stream_is_read() -> None:
    """The frames the malformed ones below are made from: read as dgchat serve's."""
    stream = _events(_chunk(None, ext={"seed": 1, "settings": {"steps": 8}}), _chunk("Halt", ext=_frame()),
                     _chunk(None, "stop", ext=FINAL), "[DONE]")
    with _server(models=_dg_models(), stream=stream) as server:
        events = _canvas_run(server.url)
    step, final = events
    assert step.canvas.tokens.tolist() == [10, 404] and step.canvas.state.tolist() == [2, 0]
    assert final.text == "Halt" and final.tokens.tolist() == [10, 401] and final.stop_reason == "eos"
    assert final.extra["settings"] == {"steps": 8}


@pytest.mark.parametrize("changes, message", [
    ({"tokens": [10 ** 30, 404]}, r"an integer has 31 digits"),
    ({"tokens": ["10", 404]}, r"`dgchat\.tokens\[0\]` must be a token id in 0\.\.404 \(got '10'\)"),
    ({"tokens": [10, 405]}, r"`dgchat\.tokens\[1\]` must be a token id in 0\.\.404"),
    ({"tokens": [10, -1]}, r"`dgchat\.tokens\[1\]` must be a token id"),
    ({"tokens": 7}, r"`dgchat\.tokens` must be a list"),
    ({"state": [2, 1000]}, r"`dgchat\.state\[1\]` must be an integer in 0\.\.3 \(got 1000\)"),
    ({"state": [2]}, r"`dgchat\.state` has 1 entries for 2 tokens"),
    ({"step": "x"}, r"`dgchat\.step` must be an integer in 0\.\.2147483647 \(got 'x'\)"),
    ({"step": 2 ** 40}, r"`dgchat\.step` must be an integer"),
    ({"total_steps": -3}, r"`dgchat\.total_steps` must be an integer"),
    ({"canvas_index": 1.5}, r"`dgchat\.canvas_index` must be an integer"),
    ({"committed": "all"}, r"`dgchat\.committed` must be an integer"),
    ({"choice": "0"}, r"`dgchat\.choice` must be an integer in 0\.\.63"),
    ({"choice": 2 ** 40}, r"`dgchat\.choice` must be an integer in 0\.\.63"),
    ({"canvas": ["Halt"]}, r"`dgchat\.canvas` has 1 entries for 2 tokens"),
    ({"canvas": ["x" * 10000, None]}, r"`dgchat\.canvas\[0\]` is 10000 characters long \(at most 256\)"),
    ({"canvas": [5, None]}, r"`dgchat\.canvas\[0\]` must be a string"),
    ({"answer_tokens": [1, 2], "answer_text": ["a"]}, r"`dgchat\.answer_text` has 1 entries for 2 tokens"),
    ({"special": ["a"]}, r"`dgchat\.special\[0\]` must be a token id"),
    ({"timing": "fast"}, r"`dgchat\.timing` must be an object"),
    ({"elapsed_s": "x"}, r"`dgchat\.elapsed_s` must be a number"),
    ({"uniform_state": 1}, r"`dgchat\.uniform_state` must be true or false"),
    ({"settings": {"logit_bias": 5}}, r"`dgchat\.settings\.logit_bias` must be a list \(got 5\)"),
    ({"settings": {"seed": -1}}, r"`dgchat\.settings\.seed`: --seed must be an integer >= 0"),
])
def test_malformed_canvas_events_are_one_line(changes: dict, message: str) -> None:
    stream = _events(_chunk("Halt", ext=_frame(**changes)), _chunk(None, "stop", ext=FINAL), "[DONE]")
    with _server(models=_dg_models(), stream=stream) as server:
        pattern = rf"^{re.escape(server.url)} sent an (invalid event|event that is not valid JSON): .*{message}"
        with pytest.raises(RemoteApiError, match=pattern) as info:
            _canvas_run(server.url)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("final, message", [
    ({"tokens": [2 ** 40]}, r"`dgchat\.tokens\[0\]` must be a token id"),
    ({"stop_reason": "\x1b]0;pwned\x07"}, r"`dgchat\.stop_reason` must be a word .* \(got '\\x1b\]0;pwned\\x07'\)"),
    ({"stats": {"steps": "x"}}, r"`dgchat\.stats\.steps` must be an integer"),
    ({"stats": {"elapsed_s": [1]}}, r"`dgchat\.stats\.elapsed_s` must be a number"),
    ({"choice": -1}, r"`dgchat\.choice` must be an integer in 0\.\.63"),
])
def test_malformed_final_records_are_one_line(final: dict, message: str) -> None:
    stream = _events(_chunk("Halt", ext=_frame()), _chunk(None, "stop", ext={**FINAL, **final}), "[DONE]")
    with _server(models=_dg_models(), stream=stream) as server:
        with pytest.raises(RemoteApiError, match=rf"sent an invalid event: .*{message}") as info:
            _canvas_run(server.url)
    assert "\x1b" not in str(info.value) and "\x07" not in str(info.value)


def test_more_tokens_than_asked_for_end_the_answer() -> None:
    too_many = {**FINAL, "tokens": [10] * 17}
    with _server(models=_dg_models(), stream=_events(_chunk(None, "stop", ext=too_many), "[DONE]")) as server:
        with pytest.raises(RemoteApiError, match=r"sent 17 answer tokens for an answer of at most 16 tokens "
                                                 r"\(max_tokens\); stopped reading$"):
            _canvas_run(server.url)


def test_an_error_body_is_one_short_escaped_line() -> None:
    """A 100 KB error message with escape sequences and line breaks: one line of at most ~200 characters."""
    for repeat in (3000, 10000):  # a 48 KB message, read whole; a 160 KB one, read up to 64 KiB
        message = "\x1b]0;pwned\x07\x1b[2J" + "bad\nthings\r\n" * repeat
        with _server(models=Reply(400, {"error": {"message": message, "code": "\x1b[31m" * 50}})) as server:
            with pytest.raises(RemoteApiError) as info:
                RemoteClient(server.url, retries=0).models()
            text = str(info.value)
            if repeat == 3000:
                assert text.startswith(f"{server.url} answered 400: ␛]0;pwned␇␛[2Jbad things␍ bad things")
                assert "\x1b" not in str(info.value.code)
            assert "\n" not in text and "\x1b" not in text and len(text) < 300 and text.endswith("…")
            if repeat == 3000:  # and so is `dgchat generate`'s error line
                run = _cli(*_generate(server.url))
                _one_line_error(run, r"answered 400: ␛\]0;pwned␇␛\[2Jbad things", seconds=20, memory=False)
    # plain text too (not JSON), and a model id quoted in "has no model"
    with _server(models=Reply(500, "x" * 100_000 + "\x1b[2J")) as server:
        with pytest.raises(RemoteApiError, match=r"answered 500: \"x{150,}…$"):
            RemoteClient(server.url, retries=0).models()
    evil = {"object": "list", "data": [{"id": "a\x1b[2J\n" + "b" * 1000, "object": "model"}]}
    with _server(models=evil) as server:
        with pytest.raises(InvalidParameterError) as info:
            RemoteEngine.connect(server.url, model="other", retries=0)
    assert "\x1b" not in str(info.value) and "\n" not in str(info.value) and len(str(info.value)) < 400


def test_a_stream_that_is_not_an_event_stream() -> None:
    with _server(stream=Reply(body={"choices": []})) as server:
        with pytest.raises(RemoteApiError, match=r"answered /v1/chat/completions with application/json, not an "
                                                 r"event stream$"):
            list(RemoteClient(server.url, retries=0).stream("/v1/chat/completions", {"messages": MESSAGES}))


def test_a_malformed_server_url_is_one_line(npc_files, tmp_path: Path) -> None:
    for bad, why in (("http://[::1", "Invalid port"), ("http://host:99999", "port 99999 is not in 1..65535"),
                     ("http://host:8765/?x=1", "no ?query or #fragment"), ("http://a\x00b", "non-printable")):
        with pytest.raises(InvalidParameterError, match=rf"^--server takes a URL such as http://127\.0\.0\.1:8765 "
                                                        rf"\(got '.*': .*{re.escape(why)}"):
            normalize_url(bad)
    assert normalize_url("http://[::1]:8765/v1") == "http://[::1]:8765"
    cards, lines = npc_files
    for args in (_generate("http://[::1"), ("--server", "http://[::1"),  # generate, the chat app, npc
                 ("npc", "--cards", str(cards), "--template", str(lines), "--out", str(tmp_path / "x.json"),
                  "--server", "http://127.0.0.1:1", "--server", "http://[::1")):
        run = _cli(*args)
        _one_line_error(run, r"--server takes a URL such as http://127\.0\.0\.1:8765 \(got 'http://\[::1': "
                             r"Invalid port", seconds=20, memory=False)


# -- npc on several servers: a bad one is dropped, the run finishes on the others ------------------

CARDS = '[[card]]\nid = "gate_guard"\nname = "Captain Brann"\nrole = "the night captain"\n'
LINES = '[defaults]\ncount = 2\nlength = "bark"\n' + "".join(
    f'\n[[line]]\ncharacter = "gate_guard"\ncontext = "gate_{i}"\nseed = {10 * i}\n' for i in range(4))


def _good_infill(body: Any) -> dict:
    """A /v1/infill answer shaped as dgchat serve's (free lines: no holes)."""
    settings = {"steps": 12, "algorithm": "confidence", "temperature": 0.8, "top_k": 0, "top_p": 1.0,
                "cfg_scale": 0.0, "alg_temp": 0.0, "mode": "dgchat", "cache": "none"}
    return {"object": "dgchat.infill", "choices": [
        {"index": i, "text": f"Halt {body['seed'] + i}!", "holes": [], "seed": body["seed"] + i, "attempt": 0,
         "score": None, "finish_reason": "stop", "problem": None, "stop_reason": "eos", "tokens": [10, 11],
         "settings": settings, "length_scores": []} for i in range(body["n"])],
        "dgchat": {"settings": {"length": "bark", "canvas_tokens": 12}, "model": dict(FILE)}}


@pytest.fixture()
def npc_files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "cards.toml").write_text(CARDS)
    (tmp_path / "lines.toml").write_text(LINES)
    return tmp_path / "cards.toml", tmp_path / "lines.toml"


HOSTILE_INFILL = {
    "deep JSON": lambda body: Raw(headers={"Content-Type": "application/json"}, body=[DEEP]),
    "garbage": lambda body: Raw(headers={"Content-Type": "application/json"}, body=[b"\x00\xff" * 1000]),
    "huge": _endless(lambda i: b" " * 65536, content_type="application/json", head=b"{"),
    "seeds of 1e400": lambda body: Raw(headers={"Content-Type": "application/json"}, body=[
        json.dumps(_good_infill(body)).replace(f'"seed": {body["seed"]}', '"seed": 1e400', 1).encode()]),
    "a 400": Reply(400, {"error": {"message": "no"}}),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_INFILL))
def test_npc_drops_a_hostile_server_and_finishes_on_the_good_one(kind: str, npc_files, tmp_path: Path) -> None:
    cards, lines = npc_files
    out = tmp_path / "lines.json"
    with _server(models=_dg_models(), infill=HOSTILE_INFILL[kind]) as bad, \
            _server(models=_dg_models(), infill=_good_infill) as good:
        run = _cli("npc", "--cards", str(cards), "--template", str(lines), "--server", bad.url, "--server", good.url,
                   "--out", str(out), "--retries", "1")
    assert run.rc == 0 and "Traceback" not in run.err, run.err
    assert run.peak_mb < PEAK_RSS_MB and run.seconds < 30
    lines_out = json.loads(out.read_text())["lines"]
    assert len(lines_out) == 8 and all(line["text"].startswith("Halt") for line in lines_out)
    err = run.err.splitlines()
    assert any(line.startswith(f"dgchat: {bad.url} failed (") and "dropped it" in line for line in err), run.err
    assert any(line.startswith(f"dgchat: {bad.url}: 0 lines") and "dropped:" in line for line in err), run.err
    assert any(line.startswith(f"dgchat: {good.url}: 8 lines") for line in err), run.err
    assert all(len(line) < 1000 and "\x1b" not in line for line in err)


def test_npc_drops_a_server_whose_model_list_is_hostile(npc_files, tmp_path: Path) -> None:
    cards, lines = npc_files
    out = tmp_path / "lines.json"
    endless = _endless(lambda i: b" " * 65536, content_type="application/json", head=b"{")
    with _server(models=endless) as bad, _server(models=_dg_models(), infill=_good_infill) as good:
        run = _cli("npc", "--cards", str(cards), "--template", str(lines), "--server", bad.url, "--server", good.url,
                   "--out", str(out))
    assert run.rc == 0 and run.peak_mb < PEAK_RSS_MB, run.err
    assert f"dgchat: {bad.url} dropped ({bad.url} sent more than 4 MiB for /v1/models" in run.err
    assert len(json.loads(out.read_text())["lines"]) == 8


def test_the_pool_takes_a_final_error_as_that_server_s_while_another_can_try() -> None:
    """A 4xx from one server: the job goes to another (and the server is dropped after its failures);
    a 4xx from every server is the request's own fault and stops the run."""
    no = Reply(400, {"error": {"message": "no"}})
    ok = Reply(body={"ok": True})
    with _server(models=VLLM_MODELS, infill=no) as bad, _server(models=VLLM_MODELS, infill=ok) as good:
        with ServerPool([bad.url, good.url], per_server=1, max_failures=2, sleep=lambda s: None) as pool:
            results = pool.run(list(range(6)), lambda c, j: c.post_json("/v1/infill", {"n": 1}))
            assert results == [{"ok": True}] * 6 and pool.stats[bad.url].dropped
        with ServerPool([bad.url], per_server=1, sleep=lambda s: None) as pool:
            with pytest.raises(RemoteApiError, match="answered 400: no"):
                pool.run([0], lambda c, j: c.post_json("/v1/infill", {"n": 1}))
    assert issubclass(RemoteApiError, RemoteError)
