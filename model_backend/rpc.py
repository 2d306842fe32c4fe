"""llama.cpp's RPC backend: a model's layers on other machines' `rpc-server`s (docs/SCALING.md).

`connect(["HOST:PORT", ...])` checks every address, talks to each server from Python first, and only
then registers it with llama.cpp (through model_backend/llamacpp/, like upstream's `--rpc`); from
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

The protocol check and the list of registered servers live one layer down, in rpc_probe.py (the
llama.cpp wrapper re-checks the servers before every model load); their names are re-exported here.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterable, Sequence

from dgchat.model_backend import llamacpp
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.rpc_probe import (  # noqa: F401  (re-exported: callers use rpc.X)
    MAX_ALIGNMENT,
    MAX_BACKENDS,
    MAX_DEVICE_MEMORY,
    PROBE_TIMEOUT,
    PROTO_MAJOR,
    PROTO_MINOR,
    SERVERS,
    RpcDevice,
    RpcEndpoint,
    RpcError,
    ServerInfo,
    abort_line,
    check_before_load,
    notices,
    probe,
    registered,
)

MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS


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


def connect(spec: str | Sequence[str], *, timeout: float = PROBE_TIMEOUT, warn: bool = True) -> list[RpcEndpoint]:
    """Check, greet and register RPC servers for every model this process loads from now on.

    Warnings about untrusted networks go to stderr (when `warn`) and stay in `notices()` for the UI.
    Registering a server twice is a no-op. Raises InvalidParameterError / RpcError, and EngineError
    when this engine was built without RPC."""
    llamacpp.require_rpc()  # before any network traffic: a build without RPC fails the same way offline
    # before llama.cpp's first RPC call: a server that hangs up or lies to it later ends the process
    # with one line instead of an abort's core dump and gdb backtrace
    llamacpp.explain_engine_aborts(abort_line)
    endpoints, warnings = parse_endpoints(spec)
    for warning in warnings:
        if warn:
            sys.stderr.write(f"dgchat: WARNING: {warning}\n")
            sys.stderr.flush()
    with SERVERS.lock:
        for w in warnings:
            if w not in SERVERS.warnings:
                SERVERS.warnings.append(w)
        new = [e for e in endpoints if e.llama_endpoint not in SERVERS.endpoints]
        SERVERS.names.update((e.llama_endpoint, e.text) for e in new)
        infos = [probe(endpoint, timeout) for endpoint in new]
        # every device becomes a backend of the model's scheduler, which takes 16 with the CPU's
        local_gpus = len(llamacpp.local_gpu_devices())
        total = sum(SERVERS.device_counts.values()) + sum(len(i.devices) for i in infos) + local_gpus + 1
        if total > MAX_BACKENDS:
            raise RpcError(f"--rpc: these RPC servers offer {total - local_gpus - 1} devices; with this machine's "
                           f"CPU{f' and {local_gpus} GPUs' if local_gpus else ''} llama.cpp can use at most "
                           f"{MAX_BACKENDS} devices in all")
        for endpoint, info in zip(new, infos):
            devices = llamacpp.rpc_register_server(endpoint.llama_endpoint)
            SERVERS.endpoints[endpoint.llama_endpoint] = endpoint
            SERVERS.device_counts[endpoint.llama_endpoint] = len(devices) or len(info.devices)
    return endpoints

