"""`dgchat rpc-server`: lend this machine's CPU (or GPUs) to another machine's `dgchat --rpc`.

llama-cpp-python's wheel does not ship llama.cpp's `rpc-server` program, so this runs the same
server from dgchat's own engine library (ggml_backend_rpc_start_server, through
model_backend/llamacpp.py): the served machine computes with exactly the patched build the client
has. Needs an engine built with `python engine/build.py --rpc`. See docs/SCALING.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import threading

from dgchat.commands.common import add_common, threads_arg
from dgchat.model_backend.errors import EngineError, InvalidParameterError

DEFAULT_PORT = 50052  # upstream rpc-server's


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rpc-server", help="serve this machine's CPU/GPU to `dgchat --rpc` elsewhere (llama.cpp RPC)",
        description="Serve this machine's CPU (or its GPUs) to another dgchat's --rpc HOST:PORT over llama.cpp's "
                    "RPC protocol. The protocol has no authentication or encryption: anyone who can reach the "
                    "port can use this machine; listen on a trusted private network only.")
    add_common(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="IPv4 address to listen on (default 127.0.0.1: this machine only; a private LAN address "
                        "to serve other machines)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--threads", type=threads_arg, default=None, metavar="N",
                   help="CPU threads, 1 to 4 per core (default: all cores)")
    p.add_argument("--cpu", action="store_true", help="serve the CPU even when this machine has a GPU")
    p.add_argument("--cache", action="store_true",
                   help="keep the weights clients send in a local cache folder, so the next load of the same "
                        "model sends hashes instead of the weights")


def listen_address(host: str) -> str:
    """The IPv4 literal llama.cpp's server needs (it cannot resolve names)."""
    from dgchat.model_backend import rpc

    if host == "0.0.0.0":
        return host
    return rpc.resolve_ipv4(host)[0]


def listen_warning(address: str) -> str | None:
    from dgchat.model_backend import rpc

    if address == "0.0.0.0":
        return ("listening on every network interface: anyone who can reach this port can use this machine "
                "(llama.cpp's RPC has no authentication or encryption). Prefer a private LAN address.")
    if not rpc.is_local_network(address):
        return (f"{address} is not a loopback or private address: anyone on that network can use this machine "
                "(llama.cpp's RPC has no authentication or encryption). Never expose it to the internet.")
    if not ipaddress.ip_address(address).is_loopback:
        return (f"listening on {address}: every machine that can reach it can use this one (llama.cpp's RPC has "
                "no authentication or encryption). Use it on a network you trust only.")
    return None


def _check_port_free(address: str, port: int) -> None:
    """A taken port is a clear error here; llama.cpp would only log a line and return."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's server does
        try:
            s.bind((address, port))
        except OSError as exc:
            raise InvalidParameterError(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    from dgchat.model_backend import llamacpp

    llamacpp.set_verbose(getattr(args, "verbose", False))
    llamacpp.require_rpc()
    if not 1 <= args.port <= 65535:
        raise InvalidParameterError("--port must be 1-65535")
    if args.threads is not None and args.threads < 1:
        raise InvalidParameterError("--threads must be at least 1")
    address = listen_address(args.host)
    if warning := listen_warning(address):
        sys.stderr.write(f"dgchat: WARNING: {warning}\n")
    _check_port_free(address, args.port)
    cache_dir = None
    if args.cache:
        from platformdirs import user_cache_dir

        cache_dir = os.path.join(user_cache_dir("dgchat"), "rpc")
        os.makedirs(cache_dir, exist_ok=True)
    endpoint = f"{address}:{args.port}"

    def started(devices: list[llamacpp.BackendDevice]) -> None:
        served = ", ".join(f"{d.name} ({d.description}, {d.memory_free / 2**30:.1f} GiB free)" for d in devices)
        sys.stderr.write(f"dgchat rpc-server: serving {served} on {endpoint}; clients: dgchat --rpc {endpoint}. "
                         "Ctrl-C stops.\n")
        sys.stderr.flush()

    failure: list[BaseException] = []

    def serve() -> None:
        try:
            llamacpp.run_rpc_server(endpoint, n_threads=args.threads or os.cpu_count() or 1,
                                    use_gpu=not args.cpu, cache_dir=cache_dir, started=started)
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    # The server loop never returns to Python; a daemon thread keeps Ctrl-C working on the main one.
    worker = threading.Thread(target=serve, name="dgchat-rpc-server", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    except KeyboardInterrupt:
        sys.stderr.write("dgchat rpc-server: stopped\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(130)  # the C server thread cannot be joined; leave without running finalizers over it
    if failure:
        raise failure[0]
    # llama.cpp's server prints its reason to stderr itself (a socket it could not create or accept on)
    raise EngineError(f"the RPC server at {endpoint} stopped (llama.cpp's reason is printed above)")
