"""llama.cpp's RPC protocol spoken from Python, and the RPC servers this process has registered.

llama.cpp's RPC client aborts the whole process on a server that cannot be reached or lies (see
model_backend/rpc.py), so every server is greeted (the protocol's HELLO) and asked what llama.cpp
will ask (devices, memory, buffer alignment and size) from here first, every answer checked:
`probe`. `rpc.connect` registers the servers that pass in `SERVERS`; `LlamaModel` probes them again
right before a model load (`check_before_load`). Pure Python: nothing here touches llama.cpp, so
both model_backend/rpc.py and model_backend/llamacpp/ import it.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from dataclasses import dataclass, field

from dgchat.model_backend.errors import DgchatError

# ggml/include/ggml-rpc.h of the pinned llama.cpp (llama-cpp-python 0.3.36): a server speaks to
# clients of the same major version and of a minor version at least its own.
PROTO_MAJOR = 7
PROTO_MINOR = 0
_CMD_HELLO = 14  # RPC_CMD_HELLO, fixed by a static_assert upstream
_CMD_GET_ALIGNMENT, _CMD_GET_MAX_SIZE, _CMD_GET_DEVICE_MEMORY, _CMD_DEVICE_COUNT = 1, 2, 11, 15  # enum rpc_cmd
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: all zero asks for plain TCP (no RDMA upgrade)
_HELLO_REPLY = 4 + _CONN_CAPS  # major, minor, patch, padding, conn_caps
PROBE_TIMEOUT = 5.0
# ggml's scheduler takes at most 16 backends (GGML_SCHED_MAX_BACKENDS, GGML_ASSERTed), the CPU among
# them: more devices than that, on one server or all together, cannot be used (engine patch 0012
# refuses more than 16 on one server too)
MAX_BACKENDS = 16
MAX_DEVICE_MEMORY = 1 << 50  # 1 PiB: more than any device has; a larger claim is a lie
MAX_ALIGNMENT = 64 * 1024  # ggml-alloc masks with it (a power of two) and divides by it; patch 0012's bound


class RpcError(DgchatError):
    """An RPC server cannot be used: unreachable, not an RPC server, or busy."""


@dataclass(frozen=True)
class RpcEndpoint:
    host: str  # as the user wrote it (a name or an IPv4 address)
    port: int
    address: str  # the IPv4 address llama.cpp is given (its client resolves IPv4 only)

    @property
    def text(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def llama_endpoint(self) -> str:
        return f"{self.address}:{self.port}"


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@dataclass(frozen=True)
class RpcDevice:
    memory_free: int
    memory_total: int
    alignment: int
    max_size: int


@dataclass(frozen=True)
class ServerInfo:
    version: tuple[int, int, int]
    devices: tuple[RpcDevice, ...]


class _Lie(Exception):
    """A reply that cannot be true: the wrong size for its request, or a value out of range."""


def _ask(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    """One request and its reply, as llama.cpp's client sends it (| cmd | size | payload |)."""
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    size = struct.unpack("<Q", _recv_exactly(sock, 8))[0]
    if size != reply_size:
        raise _Lie(f"it sent a reply of {size} bytes where {reply_size} belong")
    return _recv_exactly(sock, reply_size)


def _ask_devices(sock: socket.socket) -> tuple[RpcDevice, ...]:
    """What llama.cpp's registration and first model load ask of a server, checked."""
    count = struct.unpack("<I", _ask(sock, _CMD_DEVICE_COUNT, b"", 4))[0]
    if not 1 <= count <= MAX_BACKENDS:
        raise _Lie(f"it reports {count} devices (llama.cpp can use 1 to {MAX_BACKENDS})")
    devices = []
    for dev in range(count):
        req = struct.pack("<I", dev)
        free, total = struct.unpack("<QQ", _ask(sock, _CMD_GET_DEVICE_MEMORY, req, 16))
        alignment = struct.unpack("<Q", _ask(sock, _CMD_GET_ALIGNMENT, req, 8))[0]
        max_size = struct.unpack("<Q", _ask(sock, _CMD_GET_MAX_SIZE, req, 8))[0]
        if free > MAX_DEVICE_MEMORY or total > MAX_DEVICE_MEMORY:
            raise _Lie(f"it reports {free} bytes free of {total} on device {dev} (more than 1 PiB)")
        if alignment == 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise _Lie(f"it aligns device {dev}'s buffers to {alignment} bytes (a power of two up to {MAX_ALIGNMENT} "
                       "is valid)")
        if max_size < alignment:
            raise _Lie(f"it takes buffers of at most {max_size} bytes on device {dev}")
        devices.append(RpcDevice(free, total, alignment, max_size))
    return tuple(devices)


def probe(endpoint: RpcEndpoint, timeout: float = PROBE_TIMEOUT) -> ServerInfo:
    """Connect and greet the server as llama.cpp's client would, then ask it what llama.cpp will ask
    (devices, their memory, buffer alignment and size); returns the answers, each checked.

    Raises RpcError with what went wrong instead of letting llama.cpp abort (or hang) on it."""
    where = endpoint.text if endpoint.host == endpoint.address else f"{endpoint.text} ({endpoint.address})"
    start_hint = f"is `dgchat rpc-server --host ... --port {endpoint.port}` running there?"
    try:
        sock = socket.create_connection((endpoint.address, endpoint.port), timeout=timeout)
    except ConnectionRefusedError:
        raise RpcError(f"RPC server {where} is unreachable: connection refused ({start_hint})") from None
    except TimeoutError:
        raise RpcError(f"RPC server {where} is unreachable: no answer within {timeout:g} s "
                       f"(a firewall, or the wrong address?)") from None
    except OSError as exc:
        raise RpcError(f"RPC server {where} is unreachable: {exc.strerror or exc}") from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS) + bytes(_CONN_CAPS))
            size = struct.unpack("<Q", _recv_exactly(sock, 8))[0]
            if size != _HELLO_REPLY:
                raise ConnectionError("size")
            major, minor, patch = _recv_exactly(sock, _HELLO_REPLY)[:3]
        except TimeoutError:
            raise RpcError(f"RPC server {where} accepted the connection but did not answer the handshake within "
                           f"{timeout:g} s: an rpc-server serves one client at a time, so another client may be "
                           "using it (or the port is not an RPC server)") from None
        except (ConnectionError, OSError):
            raise RpcError(f"RPC server {where} did not complete llama.cpp's RPC handshake: the port is not an "
                           f"RPC server of protocol {PROTO_MAJOR}.x ({start_hint})") from None
        if major != PROTO_MAJOR or minor > PROTO_MINOR:
            raise RpcError(f"RPC server {where} speaks RPC protocol {major}.{minor}.{patch}; this engine speaks "
                           f"{PROTO_MAJOR}.{PROTO_MINOR}: run `dgchat rpc-server` from the same dgchat engine build "
                           "there")
        try:
            devices = _ask_devices(sock)
        except TimeoutError:
            raise RpcError(f"RPC server {where} answered the handshake but not its device questions within "
                           f"{timeout:g} s") from None
        except _Lie as exc:
            raise RpcError(f"RPC server {where} is not a usable RPC server: {exc}") from None
        except (ConnectionError, OSError):
            raise RpcError(f"RPC server {where} closed the connection after the handshake, before saying what "
                           "devices it has (not a working RPC server)") from None
    return ServerInfo((major, minor, patch), devices)


# -- the process's RPC servers ------------------------------------------------------------------


@dataclass
class ServerRegistry:
    """The RPC servers registered with llama.cpp in this process: `rpc.connect` fills it (holding
    `lock` while it probes and registers), a model load and the UI read it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    endpoints: dict[str, RpcEndpoint] = field(default_factory=dict)  # llama endpoint -> endpoint
    device_counts: dict[str, int] = field(default_factory=dict)  # llama endpoint -> devices it reported
    names: dict[str, str] = field(default_factory=dict)  # llama endpoint -> the HOST:PORT the user wrote
    warnings: list[str] = field(default_factory=list)  # about untrusted networks, for the UI


SERVERS = ServerRegistry()


def abort_line(detail: str) -> str:
    """The one line for llama.cpp aborting while RPC servers are registered (engine patch 0012 names
    the server in its messages: "RPC server 10.0.0.2:50052 closed the connection or sent ...")."""
    # no lock here: this runs on whichever thread llama.cpp aborts on, possibly while `connect`
    # holds it (an abort inside registration); plain dict reads are enough for a message
    names = dict(SERVERS.names)
    if m := re.match(r"RPC server (\S+) (.+)", detail):
        name = names.get(m[1], m[1])
        return (f"dgchat: error: RPC server {name} {m[2].rstrip('.')}; llama.cpp cannot go on without it (the "
                "generation in progress is lost)")
    servers = ", ".join(names[k] for k in list(SERVERS.endpoints)) or ", ".join(names.values())
    return (f"dgchat: error: llama.cpp stopped the process; with RPC servers ({servers}) this usually means one "
            f"went away or stopped answering (llama.cpp: {detail})")


def registered() -> list[RpcEndpoint]:
    with SERVERS.lock:
        return list(SERVERS.endpoints.values())


def notices() -> list[str]:
    """Warnings the UI should show while these servers are in use (e.g. a non-private address)."""
    with SERVERS.lock:
        return list(SERVERS.warnings)


def check_before_load(timeout: float = PROBE_TIMEOUT) -> None:
    """Greet every registered server again right before llama.cpp connects to it for a model load
    (a server that went away since `connect` would otherwise abort the process)."""
    for endpoint in registered():
        probe(endpoint, timeout)

