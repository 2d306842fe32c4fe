"""Hostile RPC peers (issue 31): `dgchat rpc-server` fed malformed requests, and the client fed lying servers.

The server half starts the real `dgchat rpc-server` on loopback and sends it, over the wire protocol of
ggml-rpc.cpp (tests/fixtures/rpc_wire.py), the requests that ended it before engine patch 0012 (one
GET_ALLOC_SIZE or INIT_TENSOR with a 0xffffffff dimension) and the other values its handlers handed to
ggml unchecked. Each must close only that connection, with the server's one-line reason on stderr,
and the server must still compute a correct graph for a well-behaved client afterwards. A graph whose
operation contradicts its shapes (no request check can know every kernel's assumptions) must cost a
restart of the serving process, not the server. Idle clients are disconnected after --idle-timeout.

The client half runs `dgchat generate --rpc` against fake servers (Python sockets) that hang up after
HELLO, answer with junk, claim 100,000 devices or an alignment of 0, first to dgchat's own check and
then, having passed it, to llama.cpp's registration and model load: each is one `dgchat: error:` line
and exit code 2 within a few seconds, never SIGABRT (-6) or gdb's backtrace.

Skipped on an engine without RPC; the server half and the lies told after dgchat's check also need
engine patch 0012 (an older dgchat engine aborts on them, which is what this file is about).
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dgchat.model_backend import rpc
from fixtures import rpc_wire as W
from fixtures.rpc_wire import Answers, FakeServer


def _engine_has(proc: str) -> bool:
    from dgchat.model_backend.llamacpp import rpc_backend

    return rpc_backend.rpc_supported() and rpc_backend.rpc_proc(proc) is not None


HAS_RPC = _engine_has("ggml_backend_rpc_add_server")
HAS_CHECKS = _engine_has("ggml_backend_rpc_dgchat_set_server_timeouts")
needs_rpc = pytest.mark.skipif(not HAS_RPC, reason="the installed engine was built without llama.cpp's RPC backend")
needs_checks = pytest.mark.skipif(not HAS_CHECKS, reason="the installed engine predates dgchat's RPC checks (engine "
                                  "patch 0012): rebuild it with python engine/build.py")
IDLE = 1.5  # the test server's --idle-timeout


class Server:
    """A supervised `dgchat rpc-server` whose stderr lines are collected as they come."""

    def __init__(self, *extra: str) -> None:
        from test_rpc import free_port

        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "dgchat", "rpc-server", "--port", str(self.port),
                                      "--threads", "1", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_serving()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_serving(self, deadline_s: float = 60) -> float:
        """Seconds until a real client's greeting and device questions are answered."""
        start = time.monotonic()
        endpoint = rpc.RpcEndpoint("127.0.0.1", self.port, "127.0.0.1")
        while True:
            assert self.proc.poll() is None, f"rpc-server exited {self.proc.returncode}: {self.lines}"
            try:
                rpc.probe(endpoint, timeout=2)
                return time.monotonic() - start
            except rpc.RpcError:
                assert time.monotonic() - start < deadline_s, self.lines
                time.sleep(0.1)

    def line_with(self, text: str, timeout: float = 5) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if found := [line for line in self.lines if text in line]:
                return found[-1]
            time.sleep(0.05)
        raise AssertionError(f"no server line with {text!r}: {self.lines}")

    def stop(self) -> None:
        from test_rpc import stop_server

        stop_server(self.proc)  # SIGINT, as Ctrl-C
        self._reader.join(5)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    if not HAS_CHECKS:
        pytest.skip("the installed engine predates dgchat's RPC checks (engine patch 0012)")
    srv = Server("--idle-timeout", str(IDLE))
    try:
        yield srv
    finally:
        srv.stop()


def add_graph(buf: W.Buffer, a: list[float], b: list[float]) -> tuple[list[bytes], bytes]:
    """SET_TENSOR requests for a and b, and GRAPH_COMPUTE of c = a + b (4 floats each) in `buf`."""
    ta = W.tensor(2, buffer=buf.ptr, data=buf.base + 64, ne=(4,))
    tb = W.tensor(3, buffer=buf.ptr, data=buf.base + 128, ne=(4,))
    tc = W.tensor(1, buffer=buf.ptr, data=buf.base, ne=(4,), op=W.OP_ADD, src=(2, 3), flags=W.FLAG_COMPUTE)
    sets = [W.request(W.SET_TENSOR, t + b"\0" + struct.pack("<Q", 0) + struct.pack("<4f", *v))
            for t, v in ((ta, a), (tb, b))]
    return sets, W.graph([1], [tc, ta, tb])


def computes_correctly(port: int) -> None:
    """A well-behaved client: allocate, upload, compute, read back."""
    with W.hello(port) as sock:
        buf = W.alloc(sock, 4096)
        sets, compute = add_graph(buf, [1, 2, 3, 4], [10, 20, 30, 40])
        sock.sendall(b"".join(sets) + compute)
        sock.sendall(W.request(W.GET_TENSOR, W.tensor(1, buffer=buf.ptr, data=buf.base, ne=(4,))
                               + struct.pack("<QQ", 0, 16)))
        assert struct.unpack("<4f", W.reply(sock, 16)) == (11, 22, 33, 44)


# -- the server: each hostile request closes its connection only --------------------------------------------
def _chain(buf: W.Buffer, n: int) -> bytes:
    # node 1's source is 2, whose source is 3, ...: listed in order this recurses n deep
    ts = [W.tensor(i, buffer=buf.ptr, data=buf.base, ne=(4,), op=W.OP_ADD, src=(i + 1, i + 1) if i < n else ())
          for i in range(1, n + 1)]
    return W.graph([1], ts)


HOSTILE = {
    # name: (request made from a fresh 4 KiB buffer, what the server's line says)
    "GET_ALLOC_SIZE with 0xffffffff dimensions (ended the server)": (
        lambda buf: W.request(W.GET_ALLOC_SIZE, struct.pack("<I", 0) + W.tensor(ne=(0xFFFFFFFF,) * 4)
                              + bytes(W.TENSOR_SIZE * W.MAX_SRC)),
        "GET_ALLOC_SIZE: too many elements"),
    "INIT_TENSOR with 0xffffffff dimensions (ended the server)": (
        lambda buf: W.request(W.INIT_TENSOR, W.tensor(ne=(0xFFFFFFFF, 0xFFFFFFFF, 1, 1))),
        "INIT_TENSOR: too many elements"),
    "a source of an invalid type": (
        lambda buf: W.request(W.GET_ALLOC_SIZE, struct.pack("<I", 0) + W.tensor() + W.tensor(5, type=999)
                              + bytes(W.TENSOR_SIZE * (W.MAX_SRC - 1))),
        "GET_ALLOC_SIZE: source 0: invalid tensor type"),
    "a quantized row that is not whole blocks": (
        lambda buf: W.request(W.INIT_TENSOR, W.tensor(type=W.TYPE_Q4_0, ne=(33,))),
        "not a multiple of the type's block size"),
    "strides whose span wraps around 64 bits": (
        lambda buf: W.request(W.GET_TENSOR, W.tensor(buffer=buf.ptr, data=buf.base, ne=(0xFFFFFFFF, 2, 2, 2),
                                                     nb=(0xFFFFFFFF,) * 4) + struct.pack("<QQ", 0, 16)),
        "tensor strides span more than 1 PiB"),
    "a tensor running past its buffer (a GGML_ASSERT upstream)": (
        lambda buf: W.request(W.SET_TENSOR, W.tensor(buffer=buf.ptr, data=buf.base + 4000, ne=(64,)) + b"\0"
                              + struct.pack("<Q", 0) + bytes(16)),
        "SET_TENSOR: tensor data"),
    "a write past the tensor": (
        lambda buf: W.request(W.SET_TENSOR, W.tensor(buffer=buf.ptr, data=buf.base, ne=(16,)) + b"\0"
                              + struct.pack("<Q", 32) + bytes(64)),
        "SET_TENSOR: region (offset 32, 64 bytes) outside the tensor (64 bytes)"),
    "a SET_TENSOR announcing a terabyte": (
        lambda buf: struct.pack("<BQ", W.SET_TENSOR, 1 << 40) + W.tensor(buffer=buf.ptr, data=buf.base, ne=(16,))
        + b"\0" + struct.pack("<Q", 0),
        "SET_TENSOR: region (offset 0, 1099511627471 bytes) outside the tensor"),
    "a read past the tensor": (
        lambda buf: W.request(W.GET_TENSOR, W.tensor(buffer=buf.ptr, data=buf.base, ne=(16,))
                              + struct.pack("<QQ", 0, 4096)),
        "GET_TENSOR: region (offset 0, 4096 bytes) outside the tensor (64 bytes)"),
    "a copy larger than its destination": (
        lambda buf: W.request(W.COPY_TENSOR, W.tensor(buffer=buf.ptr, data=buf.base, ne=(64,))
                              + W.tensor(2, buffer=buf.ptr, data=buf.base + 1024, ne=(4,))),
        "COPY_TENSOR: source (256 bytes) larger than destination (16 bytes)"),
    "a GRAPH_COMPUTE of 2^32-1 nodes": (
        lambda buf: W.request(W.GRAPH_COMPUTE, struct.pack("<II", 0, 0xFFFFFFFF) + bytes(16)),
        "GRAPH_COMPUTE: 4294967295 nodes"),
    "a GRAPH_COMPUTE announcing a terabyte": (
        lambda buf: struct.pack("<BQ", W.GRAPH_COMPUTE, 1 << 40),
        "GRAPH_COMPUTE message of 1099511627776 bytes"),
    "a graph nested 5,000 deep (a stack overflow)": (
        lambda buf: _chain(buf, 5000), "sources nested deeper than 1024"),
    "a graph listing a node twice (an out-of-bounds write upstream)": (
        lambda buf: W.graph([1, 1], [W.tensor(1, buffer=buf.ptr, data=buf.base, ne=(4,), op=W.OP_ADD, src=(2, 2)),
                                     W.tensor(2, buffer=buf.ptr, data=buf.base + 64, ne=(4,))]),
        "listed twice"),
    "a null graph node": (
        lambda buf: W.graph([0], [W.tensor(1, buffer=buf.ptr, data=buf.base, ne=(4,))]), "node 0 is null"),
    "a source without data": (
        lambda buf: W.graph([1], [W.tensor(1, buffer=buf.ptr, data=buf.base, ne=(4,), op=W.OP_ADD, src=(2, 2)),
                                  W.tensor(2, ne=(4,))]),
        "a source has no data in this client's buffers"),
    "a custom operation (a client's function pointer, called by the CPU backend)": (
        lambda buf: W.graph([1], [W.tensor(1, buffer=buf.ptr, data=buf.base, ne=(4,), op=W.OP_CUSTOM,
                                           op_params=(0x41414141, 0x41414141, 1, 0), flags=W.FLAG_COMPUTE)]),
        "custom operation (it carries a function pointer)"),
    "an unknown unary operation": (
        lambda buf: W.request(W.INIT_TENSOR, W.tensor(op=W.OP_UNARY, op_params=(1000,))), "invalid unary operation"),
    "an operation past GGML_OP_COUNT": (
        lambda buf: W.request(W.INIT_TENSOR, W.tensor(op=101)), "invalid operation"),
    "a request of the wrong size": (
        lambda buf: W.request(W.GET_ALIGNMENT, bytes(8)), "GET_ALIGNMENT request of 8 bytes (expected 4)"),
    "an unknown command": (lambda buf: W.request(200), "unknown command 200"),
    "a second HELLO": (lambda buf: W.request(W.HELLO, bytes(W.CONN_CAPS)), "a second HELLO"),
}


@needs_rpc
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_request_closes_only_its_connection(server: Server, name: str) -> None:
    make, said = HOSTILE[name]
    with W.hello(server.port) as sock:
        buf = W.alloc(sock, 4096)
        sock.sendall(make(buf))
        assert W.closed_by_peer(sock, timeout=5), "the server kept the connection open"
    assert server.line_with(said).startswith("dgchat rpc-server: closed a client's connection: ")
    assert server.proc.poll() is None
    computes_correctly(server.port)


@needs_rpc
def test_a_buffer_beyond_the_machines_memory_is_refused_not_allocated(server: Server) -> None:
    with W.hello(server.port) as sock:
        sock.sendall(W.request(W.ALLOC_BUFFER, struct.pack("<IQ", 0, 1 << 50)))
        assert struct.unpack("<QQ", W.reply(sock, 16)) == (0, 0)  # an ordinary failed allocation
        W.alloc(sock, 4096)  # the connection goes on
    assert "it would hold more than the device's" in server.line_with("refused a client's buffer of 1125899906842624")


@needs_rpc
def test_a_kernel_assert_restarts_the_serving_process(server: Server) -> None:
    """c = a + b with b of another shape: ggml-cpu GGML_ASSERTs inside the computation, which no
    request check foresees for every operation; the supervisor starts the server again."""
    with W.hello(server.port) as sock:
        buf = W.alloc(sock, 4096)
        bad = W.graph([1], [W.tensor(1, buffer=buf.ptr, data=buf.base, ne=(4,), op=W.OP_ADD, src=(2, 3),
                                     flags=W.FLAG_COMPUTE),
                            W.tensor(2, buffer=buf.ptr, data=buf.base + 64, ne=(8,)),
                            W.tensor(3, buffer=buf.ptr, data=buf.base + 128, ne=(3,))])
        sock.sendall(bad)
        assert W.closed_by_peer(sock, timeout=10)
    back = server.wait_serving(deadline_s=30)
    assert back < 30
    assert "GGML_ASSERT" in server.line_with("dgchat rpc-server: error: llama.cpp stopped while serving a client")
    assert server.line_with("serving again on").endswith("(restart 1)")
    assert not any("Backtrace" in line or line.startswith("#0 ") for line in server.lines)
    computes_correctly(server.port)


@needs_rpc
def test_idle_clients_are_disconnected_and_do_not_block_others(server: Server) -> None:
    silent = socket.create_connection(("127.0.0.1", server.port))  # connects, never greets
    greeted = None
    try:
        start = time.monotonic()
        assert W.closed_by_peer(silent, timeout=IDLE + 5)
        assert time.monotonic() - start < IDLE + 2
        assert server.line_with(f"sent nothing for {IDLE:g} s after connecting")
        # greeted, but holds no memory: the same bound between requests
        greeted = W.hello(server.port)
        assert W.closed_by_peer(greeted, timeout=IDLE + 5)
        assert server.line_with("between requests (--idle-timeout)")
        # stalled inside a request (a slowloris)
        greeted = W.hello(server.port)
        greeted.sendall(struct.pack("<B", W.ALLOC_BUFFER) + b"\x10\x00")
        assert W.closed_by_peer(greeted, timeout=IDLE + 5)
        assert server.line_with("inside a request")
        # the next client is served at once
        computes_correctly(server.port)
    finally:
        silent.close()
        if greeted is not None:
            greeted.close()


@needs_rpc
def test_a_client_holding_memory_may_pause_between_requests(server: Server) -> None:
    """A loaded model (the chat app waiting for its user, `dgchat serve --rpc`) is not an idle client:
    --idle-timeout does not apply to it, only --model-idle-timeout (default: never)."""
    with W.hello(server.port) as sock:
        W.alloc(sock, 4096)
        time.sleep(IDLE + 1)
        sock.sendall(W.request(W.DEVICE_COUNT))
        assert struct.unpack("<I", W.reply(sock, 4)) == (1,)


@needs_checks
def test_model_idle_timeout_disconnects_a_client_holding_memory() -> None:
    srv = Server("--idle-timeout", "30", "--model-idle-timeout", "1")
    try:
        with W.hello(srv.port) as sock:
            W.alloc(sock, 4096)
            assert W.closed_by_peer(sock, timeout=6)
        assert srv.line_with("between requests (--model-idle-timeout)")
    finally:
        srv.stop()


@needs_rpc
def test_rpc_server_refuses_bad_timeouts() -> None:
    from test_rpc import dgchat, free_port

    res = dgchat("rpc-server", "--port", str(free_port()), "--idle-timeout", "-1")
    assert res.returncode == 2
    assert res.stderr.strip() == "dgchat: error: --idle-timeout must be a number of seconds from 0 (never) to one year"


# -- the client: lying servers ---------------------------------------------------------------------------------
def generate_against(fake: FakeServer, model: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-m", str(model), "--rpc",
                          f"127.0.0.1:{fake.port}", "-p", "hi", "--gen-length", "8", "--steps", "4", "--json"],
                         capture_output=True, text=True, timeout=60)
    return res, time.monotonic() - start


def assert_one_line_failure(res: subprocess.CompletedProcess, seconds: float, expected: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])  # not -6 (SIGABRT)
    assert "Backtrace" not in res.stderr and "#0 " not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("dgchat: error: ")]
    assert len(errors) == 1 and errors[0] == res.stderr.strip().splitlines()[-1], res.stderr
    assert expected in errors[0], errors[0]
    assert seconds < 20
    assert res.stdout == ""


# what dgchat's own check (model_backend/rpc.py probe) is told; with or without patch 0012
LIES_TO_THE_CHECK = {
    "HELLO, then hangs up": (Answers(devices=None), "closed the connection after the handshake"),
    "HELLO, then junk": (Answers(garbage_after_hello=True), "is not a usable RPC server: it sent a reply of"),
    "100,000 devices (hung the client)": (Answers(devices=100_000), "it reports 100000 devices (llama.cpp can use "
                                                                    "1 to 16)"),
    "no devices": (Answers(devices=0), "it reports 0 devices"),
    "an alignment of 0 (a division by zero)": (Answers(alignment=0), "aligns device 0's buffers to 0 bytes"),
    "2^64-1 bytes of memory": (Answers(memory=(2**64 - 1, 2**64 - 1)), "(more than 1 PiB)"),
    "another protocol version": (Answers(version=(8, 0, 0)), "speaks RPC protocol 8.0.0; this engine speaks 7.0"),
}


@needs_rpc
@pytest.mark.parametrize("name", list(LIES_TO_THE_CHECK))
def test_a_lying_server_is_refused_with_one_line(llada_gguf: Path, name: str) -> None:
    answers, expected = LIES_TO_THE_CHECK[name]
    with FakeServer([answers]) as fake:
        res, seconds = generate_against(fake, llada_gguf)
    assert_one_line_failure(res, seconds, f"dgchat: error: RPC server 127.0.0.1:{fake.port} ")
    assert expected in res.stderr


# told to llama.cpp itself after an honest answer to dgchat's check (connection 0): patch 0012
LIES_TO_LLAMA_CPP = {
    "hangs up at registration": ([Answers(), Answers(devices=None)],
                                 "could not register RPC server 127.0.0.1:{port}: it closed the connection or sent a "
                                 "malformed reply to DEVICE_COUNT"),
    "junk at registration": ([Answers(), Answers(garbage_after_hello=True)],
                             "could not register RPC server 127.0.0.1:{port}: it closed the connection or sent a "
                             "malformed reply to DEVICE_COUNT"),
    "100,000 devices at registration": ([Answers(), Answers(devices=100_000)],
                                        "could not register RPC server 127.0.0.1:{port}: it reports 100000 devices "
                                        "(at most 16 can be used)"),
    # honest until llama.cpp allocates the model's buffers, then hangs up: llama.cpp's client cannot
    # take an error there and aborts; dgchat's abort callback makes it this line
    "hangs up when the model loads": ([Answers()],
                                      "RPC server 127.0.0.1:{port} closed the connection or sent a malformed reply; "
                                      "llama.cpp cannot go on without it"),
}


@needs_checks
@pytest.mark.parametrize("name", list(LIES_TO_LLAMA_CPP))
def test_a_server_lying_to_llama_cpp_is_one_line_not_an_abort(llada_gguf: Path, name: str) -> None:
    answers, expected = LIES_TO_LLAMA_CPP[name]
    with FakeServer(answers) as fake:
        res, seconds = generate_against(fake, llada_gguf)
    assert fake.connections >= 2  # it got past dgchat's check: llama.cpp met the lie
    assert_one_line_failure(res, seconds, expected.format(port=fake.port))
