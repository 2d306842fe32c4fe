"""llama.cpp's RPC backend: a model's layers on other machines' `rpc-server`s (docs/SCALING.md).

`connect(["HOST:PORT", ...])` checks every address, talks to each server from Python first, and only
then registers it with llama.cpp (through model_backend/llamacpp.py, like upstream's `--rpc`); from
then on every model this process loads puts its layers on those servers (and on local GPUs).

Why the checks happen here and not in llama.cpp: its RPC client aborts the whole process when a
server cannot be reached, refuses the handshake, or cannot be resolved (GGML_ABORT in
ggml-rpc.cpp), so each server is connected to and greeted (the protocol's HELLO) from Python with a
short timeout before llama.cpp is allowed near it, and asked what llama.cpp's registration and
first model load will ask (device count, memory, buffer alignment and maximum size), every answer
checked against bounds: a peer that lies there (100,000 devices hung the client; an alignment of 0
is a division by zero) or hangs up is a one-line RpcError. What a server says after that, on
llama.cpp's own connection, is llama.cpp's to check: dgchat's engine (patch 0012) turns a failed
registration into an error return, and everything later into an abort that `connect` makes one
`dgchat: error: ...` line with exit code 2 (never a core dump). The protocol has no authentication
or encryption: upstream says it is not for untrusted networks, hence the loud warning for any
address that is not loopback or private.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dgchat.model_backend.errors import DgchatError, InvalidParameterError

# ggml/include/ggml-rpc.h of the pinned llama.cpp (llama-cpp-python 0.3.36): a server speaks to
# clients of the same major version and of a minor version at least its own.
PROTO_MAJOR = 7
PROTO_MINOR = 0
_CMD_HELLO = 14  # RPC_CMD_HELLO, fixed by a static_assert upstream
_CMD_GET_ALIGNMENT, _CMD_GET_MAX_SIZE, _CMD_GET_DEVICE_MEMORY, _CMD_DEVICE_COUNT = 1, 2, 11, 15  # enum rpc_cmd
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: all zero asks for plain TCP (no RDMA upgrade)
_HELLO_REPLY = 4 + _CONN_CAPS  # major, minor, patch, padding, conn_caps
PROBE_TIMEOUT = 5.0
MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS
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


def split_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port). llama.cpp splits at the first colon, so IPv6 literals cannot work."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text:
        raise InvalidParameterError(f"RPC server {text!r}: expected HOST:PORT (e.g. 192.168.1.20:50052)")
    if ":" in host or host.startswith("["):
        raise InvalidParameterError(f"RPC server {text!r}: llama.cpp's RPC client speaks IPv4 only; give an IPv4 "
                                    "address or a host name")
    try:
        port = int(port_text)
    except ValueError:
        raise InvalidParameterError(f"RPC server {text!r}: the port must be a number") from None
    if not 1 <= port <= 65535:
        raise InvalidParameterError(f"RPC server {text!r}: the port must be 1-65535")
    return host, port


def resolve_ipv4(host: str) -> list[str]:
    """Every IPv4 address `host` stands for (an IPv4 literal stands for itself)."""
    try:
        return [str(ipaddress.IPv4Address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise RpcError(f"RPC server host {host!r} cannot be resolved to an IPv4 address ({exc})") from None
    seen: list[str] = []
    for info in infos:
        if (addr := str(info[4][0])) not in seen:
            seen.append(addr)
    if not seen:
        raise RpcError(f"RPC server host {host!r} has no IPv4 address")
    return seen


def is_local_network(address: str) -> bool:
    """Loopback, private (RFC 1918 and the like) or link-local: where RPC may be acceptable."""
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or ip.is_private or ip.is_link_local


def untrusted_network_warning(endpoint_text: str, addresses: Iterable[str]) -> str | None:
    """The warning for an endpoint any of whose addresses is neither loopback nor private, else None."""
    public = [a for a in addresses if not is_local_network(a)]
    if not public:
        return None
    shown = ", ".join(public)
    at = f" ({shown})" if shown != endpoint_text.rpartition(":")[0] else ""
    return (f"RPC server {endpoint_text}{at} is not on a loopback or private network. llama.cpp's RPC protocol "
            "has no authentication or encryption: anyone who can reach the port can run code on that machine, "
            "and the model and your prompts cross the network in the clear. Use it only on a network you trust "
            "(or through an SSH tunnel/VPN).")


def parse_endpoints(spec: str | Sequence[str]) -> tuple[list[RpcEndpoint], list[str]]:
    """'H:P,H:P' (or a list of such strings) -> endpoints (resolved) and the warnings they deserve."""
    items = [spec] if isinstance(spec, str) else list(spec)
    texts = [t.strip() for item in items for t in item.split(",") if t.strip()]
    if not texts:
        raise InvalidParameterError("--rpc: no RPC server given (HOST:PORT[,HOST:PORT...])")
    endpoints: list[RpcEndpoint] = []
    warnings: list[str] = []
    for text in texts:
        host, port = split_host_port(text)
        addresses = resolve_ipv4(host)
        endpoint = RpcEndpoint(host=host, port=port, address=addresses[0])
        if any(e.llama_endpoint == endpoint.llama_endpoint for e in endpoints):
            raise InvalidParameterError(f"--rpc: {text} is given twice")
        endpoints.append(endpoint)
        if warning := untrusted_network_warning(endpoint.text, addresses):
            warnings.append(warning)
    if len(endpoints) > MAX_SERVERS:
        raise InvalidParameterError(f"--rpc: at most {MAX_SERVERS} RPC servers")
    return endpoints, warnings


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
_lock = threading.Lock()
_registered: dict[str, RpcEndpoint] = {}  # llama endpoint -> endpoint
_device_counts: dict[str, int] = {}  # llama endpoint -> devices it reported
_names: dict[str, str] = {}  # llama endpoint -> the HOST:PORT the user wrote (for messages)
_warnings: list[str] = []


def _abort_line(detail: str) -> str:
    """The one line for llama.cpp aborting while RPC servers are registered (engine patch 0012 names
    the server in its messages: "RPC server 10.0.0.2:50052 closed the connection or sent ...")."""
    # no _lock here: this runs on whichever thread llama.cpp aborts on, possibly while `connect`
    # holds it (an abort inside registration); plain dict reads are enough for a message
    names = dict(_names)
    if m := re.match(r"RPC server (\S+) (.+)", detail):
        name = names.get(m[1], m[1])
        return (f"dgchat: error: RPC server {name} {m[2].rstrip('.')}; llama.cpp cannot go on without it (the "
                "generation in progress is lost)")
    servers = ", ".join(names[k] for k in list(_registered)) or ", ".join(names.values())
    return (f"dgchat: error: llama.cpp stopped the process; with RPC servers ({servers}) this usually means one "
            f"went away or stopped answering (llama.cpp: {detail})")


def connect(spec: str | Sequence[str], *, timeout: float = PROBE_TIMEOUT, warn: bool = True) -> list[RpcEndpoint]:
    """Check, greet and register RPC servers for every model this process loads from now on.

    Warnings about untrusted networks go to stderr (when `warn`) and stay in `notices()` for the UI.
    Registering a server twice is a no-op. Raises InvalidParameterError / RpcError, and EngineError
    when this engine was built without RPC."""
    from dgchat.model_backend import llamacpp

    llamacpp.require_rpc()  # before any network traffic: a build without RPC fails the same way offline
    # before llama.cpp's first RPC call: a server that hangs up or lies to it later ends the process
    # with one line instead of an abort's core dump and gdb backtrace
    llamacpp.explain_engine_aborts(_abort_line)
    endpoints, warnings = parse_endpoints(spec)
    for warning in warnings:
        if warn:
            sys.stderr.write(f"dgchat: WARNING: {warning}\n")
            sys.stderr.flush()
    with _lock:
        for w in warnings:
            if w not in _warnings:
                _warnings.append(w)
        new = [e for e in endpoints if e.llama_endpoint not in _registered]
        _names.update((e.llama_endpoint, e.text) for e in new)
        infos = [probe(endpoint, timeout) for endpoint in new]
        # every device becomes a backend of the model's scheduler, which takes 16 with the CPU's
        local_gpus = len(llamacpp.local_gpu_devices())
        total = sum(_device_counts.values()) + sum(len(i.devices) for i in infos) + local_gpus + 1
        if total > MAX_BACKENDS:
            raise RpcError(f"--rpc: these RPC servers offer {total - local_gpus - 1} devices; with this machine's "
                           f"CPU{f' and {local_gpus} GPUs' if local_gpus else ''} llama.cpp can use at most "
                           f"{MAX_BACKENDS} devices in all")
        for endpoint, info in zip(new, infos):
            devices = llamacpp.rpc_register_server(endpoint.llama_endpoint)
            _registered[endpoint.llama_endpoint] = endpoint
            _device_counts[endpoint.llama_endpoint] = len(devices) or len(info.devices)
    return endpoints


def registered() -> list[RpcEndpoint]:
    with _lock:
        return list(_registered.values())


def notices() -> list[str]:
    """Warnings the UI should show while these servers are in use (e.g. a non-private address)."""
    with _lock:
        return list(_warnings)


def check_before_load(timeout: float = PROBE_TIMEOUT) -> None:
    """Greet every registered server again right before llama.cpp connects to it for a model load
    (a server that went away since `connect` would otherwise abort the process)."""
    for endpoint in registered():
        probe(endpoint, timeout)
