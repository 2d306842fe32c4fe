"""`dgchat rpc-server`: lend this machine's CPU (or GPUs) to another machine's `dgchat --rpc`.

llama-cpp-python's wheel does not ship llama.cpp's `rpc-server` program, so this runs the same
server from dgchat's own engine library (ggml_backend_rpc_start_server, through
model_backend/llamacpp/): the served machine computes with exactly the patched build the client
has. Needs the engine's RPC backend: in the default build (`python engine/build.py`), not in one
built with `--no-rpc`. See docs/SCALING.md.
"""

from __future__ import annotations

import argparse
import collections
import ipaddress
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from dgchat.commands.common import add_common, threads_arg
from dgchat.model_backend import llamacpp, rpc
from dgchat.model_backend.errors import EngineError, InvalidParameterError

DEFAULT_PORT = 50052  # upstream rpc-server's
DEFAULT_IDLE_TIMEOUT = 30.0  # seconds; see --idle-timeout
# The supervised serving process: the write end of a pipe it signals readiness on (set by the parent,
# which is how the serving process knows it is one), and how many times it was started before.
CHILD_ENV = "DGCHAT_RPC_SERVER_READY_FD"
RESTARTS_ENV = "DGCHAT_RPC_SERVER_RESTARTS"
ABORT_EXIT = 3  # the serving process's status when llama.cpp aborted while it served a request


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rpc-server", help="serve this machine's CPU/GPU to `dgchat --rpc` elsewhere (llama.cpp RPC)",
        description="Serve this machine's CPU (or its GPUs) to another dgchat's --rpc HOST:PORT over llama.cpp's "
                    "RPC protocol. The protocol has no authentication or encryption: anyone who can reach the "
                    "port can use this machine; listen on a trusted private network only. One client is served "
                    "at a time.")
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
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT, metavar="SECONDS",
                   help="disconnect a client that sends nothing for this long before its greeting, in the middle "
                        "of a request, or between requests while it has no memory here (default "
                        f"{DEFAULT_IDLE_TIMEOUT:g}; 0: never). The server serves one client at a time, so such a "
                        "client would keep everyone else out")
    p.add_argument("--model-idle-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="also disconnect a client that holds memory here (a loaded model) after this long without "
                        "a request (default 0: never, so `dgchat serve --rpc` and the chat app can wait for their "
                        "users; set it when several people share this server)")


def listen_address(host: str) -> str:
    """The IPv4 literal llama.cpp's server needs (it cannot resolve names)."""
    if host == "0.0.0.0":
        return host
    return rpc.resolve_ipv4(host)[0]


def listen_warning(address: str) -> str | None:
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


def _check_timeout(name: str, value: float) -> None:
    if not math.isfinite(value) or not 0 <= value <= 86400 * 365:
        raise InvalidParameterError(f"{name} must be a number of seconds from 0 (never) to one year")


def run(args: argparse.Namespace) -> int:
    llamacpp.set_verbose(getattr(args, "verbose", False))
    llamacpp.require_rpc()
    if not 1 <= args.port <= 65535:
        raise InvalidParameterError("--port must be 1-65535")
    if args.threads is not None and args.threads < 1:
        raise InvalidParameterError("--threads must be at least 1")
    _check_timeout("--idle-timeout", args.idle_timeout)
    _check_timeout("--model-idle-timeout", args.model_idle_timeout)
    address = listen_address(args.host)
    ready_fd = os.environ.pop(CHILD_ENV, None)
    if ready_fd is not None:  # the serving process of a supervising `dgchat rpc-server`
        return _serve(args, address, int(ready_fd), int(os.environ.pop(RESTARTS_ENV, "0") or 0))
    if warning := listen_warning(address):
        sys.stderr.write(f"dgchat: WARNING: {warning}\n")
    _check_port_free(address, args.port)
    if os.name == "posix":
        return _supervise(args, address)
    return _serve(args, address, None, 0)  # Windows: no supervisor (no pass_fds); a crash ends the server


def _child_command(args: argparse.Namespace, address: str) -> list[str]:
    cmd = [sys.executable, "-m", "dgchat", "rpc-server", "--host", address, "--port", str(args.port),
           "--idle-timeout", repr(args.idle_timeout), "--model-idle-timeout", repr(args.model_idle_timeout)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    if args.cpu:
        cmd.append("--cpu")
    if args.cache:
        cmd.append("--cache")
    if getattr(args, "verbose", False):
        cmd.append("--verbose")
    return cmd


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _supervise(args: argparse.Namespace, address: str) -> int:
    """Run the server in a child process and start it again whenever it dies while serving.

    The child runs in a session of its own, so Ctrl-C reaches this process only, which stops the
    child and says so; the child's stdin is a pipe from this process and it exits when that pipe
    closes, so it never outlives a supervisor that was killed. A child that dies before it is ready
    to serve (no devices, the port taken meanwhile) is not started again: its error is the result."""
    cmd = _child_command(args, address)
    restarts = 0
    recent: collections.deque[float] = collections.deque(maxlen=5)
    while True:
        read_end, write_end = os.pipe()
        env = dict(os.environ, **{CHILD_ENV: str(write_end), RESTARTS_ENV: str(restarts)})
        try:
            child = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, pass_fds=(write_end,),
                                     start_new_session=True)
        finally:
            os.close(write_end)
        try:
            ready = os.read(read_end, 1) == b"r"  # b"" when the child exits first
            rc = child.wait()
        except KeyboardInterrupt:
            _stop(child)
            sys.stderr.write("dgchat rpc-server: stopped\n")
            sys.stderr.flush()
            return 130
        finally:
            os.close(read_end)
            if child.stdin is not None and child.poll() is not None:
                child.stdin.close()
        if not ready or not (rc == ABORT_EXIT or rc < 0):
            if rc < 0:
                sys.stderr.write(f"dgchat: error: the RPC server process died of {_signal_name(rc)} while "
                                 "starting\n")
            return rc if rc > 0 else 2  # else the child said why (a DgchatError line, or llama.cpp's reason)
        if rc < 0:
            sys.stderr.write(f"dgchat rpc-server: the serving process died of {_signal_name(rc)} while serving a "
                             "client; starting it again\n")
            sys.stderr.flush()
        restarts += 1
        recent.append(time.monotonic())
        if len(recent) == recent.maxlen and recent[-1] - recent[0] < 10:
            time.sleep(2)  # a client crashing it in a loop: restart, but not as fast as it can crash it


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _serve(args: argparse.Namespace, address: str, ready_fd: int | None, restarts: int) -> int:
    """Serve in this process (the supervisor's child, or the only process on Windows)."""
    supervised = ready_fd is not None
    if supervised:
        # the supervisor starts this process again; one line instead of a core dump and gdb's backtrace
        llamacpp.explain_engine_aborts(
            lambda detail: f"dgchat rpc-server: error: llama.cpp stopped while serving a client ({detail})",
            exit_code=ABORT_EXIT)
        threading.Thread(target=_exit_with_supervisor, name="dgchat-rpc-lifeline", daemon=True).start()
    else:
        llamacpp.explain_engine_aborts(
            lambda detail: f"dgchat: error: the RPC server stopped: llama.cpp aborted while serving a client "
                           f"({detail})")
    if not llamacpp.set_rpc_server_timeouts(args.idle_timeout, args.model_idle_timeout) and restarts == 0:
        sys.stderr.write("dgchat rpc-server: WARNING: this engine predates dgchat's RPC request checks (engine "
                         "patch 0012): a malformed request can stop the server and an idle client keeps it busy; "
                         "rebuild it with python engine/build.py\n")
    cache_dir = None
    if args.cache:
        from platformdirs import user_cache_dir

        cache_dir = os.path.join(user_cache_dir("dgchat"), "rpc")
        os.makedirs(cache_dir, exist_ok=True)
    endpoint = f"{address}:{args.port}"

    def started(devices: list[llamacpp.BackendDevice]) -> None:
        if restarts:
            sys.stderr.write(f"dgchat rpc-server: serving again on {endpoint} (restart {restarts})\n")
        else:
            served = ", ".join(f"{d.name} ({d.description}, {d.memory_free / 2**30:.1f} GiB free)" for d in devices)
            sys.stderr.write(f"dgchat rpc-server: serving {served} on {endpoint}; clients: dgchat --rpc {endpoint}. "
                             "Ctrl-C stops.\n")
        sys.stderr.flush()
        if ready_fd is not None:
            os.write(ready_fd, b"r")

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


def _exit_with_supervisor() -> None:
    """The supervisor holds the other end of stdin: when it is gone (killed), so is this process."""
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except (OSError, ValueError):
        pass
    os._exit(0)
