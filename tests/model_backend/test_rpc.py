"""llama.cpp RPC (issue 17, item 3): `dgchat --rpc HOST:PORT` and `dgchat rpc-server`.

The address checks, the build flag and the error of an engine built without RPC run everywhere.
The rest needs an engine with the RPC backend (the default build) and is skipped, with that reason,
on an engine built with `--no-rpc` or by a plain PyPI install: two real `dgchat rpc-server` processes on loopback, a greedy run
with the model's layers on them gives the same tokens as a local run, and a server that is
unreachable, not an RPC server, or gone before the model loads is a one-line error with exit
code 2, never an abort of the process (llama.cpp's RPC client GGML_ABORTs on all three).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dgchat.model_backend import rpc
from dgchat.model_backend.errors import InvalidParameterError
from fixtures.engine_build import build


def dgchat(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_has_rpc() -> bool:
    from dgchat.model_backend import llamacpp

    return llamacpp.rpc_supported()


needs_rpc = pytest.mark.skipif(not engine_has_rpc(), reason="the installed engine was built without llama.cpp's "
                               "RPC backend (built with python engine/build.py --no-rpc)")


# -- everywhere: address checks, build flag, the error of a build without RPC ---------------------
@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.9", "192.168.178.20",
                                     "169.254.3.4"])
def test_loopback_and_private_addresses_are_local(address: str) -> None:
    assert rpc.is_local_network(address)
    assert rpc.untrusted_network_warning(f"{address}:50052", [address]) is None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "100.64.0.1", "172.32.0.1", "192.169.0.1"])
def test_public_addresses_get_the_untrusted_network_warning(address: str) -> None:
    assert not rpc.is_local_network(address)
    warning = rpc.untrusted_network_warning(f"{address}:50052", [address])
    assert warning is not None
    assert f"RPC server {address}:50052 is not on a loopback or private network" in warning
    assert "no authentication or encryption" in warning


def test_a_name_warns_when_any_of_its_addresses_is_public() -> None:
    warning = rpc.untrusted_network_warning("gpu-box:50052", ["192.168.1.7", "203.0.114.9"])
    assert warning is not None and "(203.0.114.9)" in warning and "192.168.1.7" not in warning
    assert rpc.untrusted_network_warning("gpu-box:50052", ["192.168.1.7", "10.0.0.7"]) is None


def test_parse_endpoints_resolves_names_and_collects_warnings() -> None:
    endpoints, warnings = rpc.parse_endpoints("localhost:50052, 192.168.1.20:50053,8.8.4.4:50054")
    assert [e.text for e in endpoints] == ["localhost:50052", "192.168.1.20:50053", "8.8.4.4:50054"]
    assert endpoints[0].address == "127.0.0.1" and endpoints[0].llama_endpoint == "127.0.0.1:50052"
    assert len(warnings) == 1 and "8.8.4.4:50054" in warnings[0]


@pytest.mark.parametrize(("spec", "message"), [
    ("", "no RPC server given"),
    ("50052", "expected HOST:PORT"),
    ("host:", "expected HOST:PORT"),
    ("127.0.0.1:http", "the port must be a number"),
    ("127.0.0.1:0", "the port must be 1-65535"),
    ("127.0.0.1:70000", "the port must be 1-65535"),
    ("[::1]:50052", "IPv4 only"),
    ("::1:50052", "IPv4 only"),
    ("127.0.0.1:50052,localhost:50052", "is given twice"),
])
def test_bad_rpc_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        rpc.parse_endpoints(spec)


def test_an_unresolvable_host_is_an_rpc_error() -> None:
    with pytest.raises(rpc.RpcError, match="cannot be resolved"):
        rpc.parse_endpoints("no-such-host.invalid:50052")


def test_build_flag_adds_the_rpc_backend_once() -> None:
    assert build.effective_cmake_args("", True) == "-DGGML_RPC=ON"
    assert build.effective_cmake_args("-DGGML_CUDA=on", True) == "-DGGML_CUDA=on -DGGML_RPC=ON"
    assert build.effective_cmake_args("-DGGML_RPC=on", True) == "-DGGML_RPC=on"
    assert build.effective_cmake_args("-DGGML_CUDA=on", False) == "-DGGML_CUDA=on"
    patches = build.patch_files()
    assert build.build_key(patches, build.effective_cmake_args("", True)) != build.build_key(patches, "")


@pytest.mark.skipif(engine_has_rpc(), reason="checks the error of an engine built without RPC")
def test_without_rpc_in_the_engine_the_error_says_how_to_build_it(llada_gguf: Path) -> None:
    for args in (("generate", "-m", str(llada_gguf), "-p", "hi", "--rpc", "127.0.0.1:50052"),
                 ("rpc-server", "--port", str(free_port()))):
        res = dgchat(*args)
        assert res.returncode == 2, res.stderr
        assert "this engine was built without RPC: python engine/build.py (without --no-rpc)" in res.stderr


@pytest.mark.parametrize(("address", "expected"), [
    ("127.0.0.1", None),
    ("192.168.1.20", "listening on 192.168.1.20: every machine that can reach it can use this one"),
    ("0.0.0.0", "listening on every network interface"),
    ("8.8.8.8", "8.8.8.8 is not a loopback or private address"),
])
def test_rpc_server_listen_warnings(address: str, expected: str | None) -> None:
    from dgchat.commands.rpc_server import listen_warning

    warning = listen_warning(address)
    assert (warning is None) if expected is None else (warning is not None and warning.startswith(expected))


def test_rpc_flag_conflicts_are_one_line_errors(llada_gguf: Path) -> None:
    res = dgchat("--rpc", "127.0.0.1:50052", "generate", "-m", str(llada_gguf), "-p", "hi")
    assert res.returncode == 2 and "put --rpc after the subcommand" in res.stderr
    res = dgchat("generate", "--rpc", "127.0.0.1:50052", "--server", "http://127.0.0.1:9", "-p", "hi")
    assert res.returncode == 2 and "give one of them" in res.stderr
    res = dgchat("bench", "-m", str(llada_gguf), "--rpc", "127.0.0.1:50052")
    assert res.returncode == 2 and "--rpc is not supported there" in res.stderr


# -- with an RPC engine: real servers on loopback --------------------------------------------------
def wait_until_serving(port: int, proc: subprocess.Popen, deadline_s: float = 60) -> None:
    endpoint = rpc.RpcEndpoint("127.0.0.1", port, "127.0.0.1")
    end = time.monotonic() + deadline_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"rpc-server exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            rpc.probe(endpoint, timeout=2)
            return
        except rpc.RpcError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "dgchat", "rpc-server", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(port, proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def stop_server(proc: subprocess.Popen) -> str:
    """Stops it as Ctrl-C does; returns what it wrote to stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stderr.read() if proc.stderr else ""


@pytest.fixture(scope="module")
def two_servers() -> Iterator[list[int]]:
    if not engine_has_rpc():
        pytest.skip("the installed engine was built without llama.cpp's RPC backend")
    ports = [free_port(), free_port()]
    procs = [start_server(p) for p in ports]
    try:
        yield ports
    finally:
        for proc in procs:
            stop_server(proc)


GREEDY = ("-p", "Halt, traveller", "--gen-length", "16", "--steps", "8", "--block-length", "8",
          "--temperature", "0", "--algorithm", "confidence", "--seed", "0", "--json")


@needs_rpc
@pytest.mark.slow
def test_layers_on_two_rpc_servers_give_the_local_tokens(llada_gguf: Path, two_servers: list[int]) -> None:
    local = dgchat("generate", "-m", str(llada_gguf), *GREEDY)
    assert local.returncode == 0, local.stderr
    spec = ",".join(f"127.0.0.1:{p}" for p in two_servers)
    remote = dgchat("generate", "-m", str(llada_gguf), "--rpc", spec, "--verbose", *GREEDY)
    assert remote.returncode == 0, remote.stderr[-3000:]
    # the layers really are on both servers (llama.cpp's load log names each RPC buffer)
    for port in two_servers:
        assert f"RPC0[127.0.0.1:{port}] model buffer size" in remote.stderr
    assert "WARNING" not in remote.stderr  # loopback: no untrusted-network warning
    local_out, remote_out = json.loads(local.stdout), json.loads(remote.stdout)
    assert len(local_out["tokens"]) > 0
    assert remote_out["tokens"] == local_out["tokens"]
    assert remote_out["text"] == local_out["text"]


@needs_rpc
def test_the_local_machine_reports_no_gpu_in_an_rpc_build() -> None:
    """An RPC build's llama_supports_gpu_offload() is true on any machine; dgchat's hardware view,
    fit badges and default offload count only real GPUs (this machine has none)."""
    import llama_cpp
    from dgchat.model_backend import llamacpp

    assert llama_cpp.llama_supports_gpu_offload()
    assert llamacpp.engine_info().gpu_offload is False


@needs_rpc
def test_an_unreachable_server_is_a_clear_error(llada_gguf: Path, two_servers: list[int]) -> None:
    closed = free_port()
    res = dgchat("generate", "-m", str(llada_gguf), "--rpc", f"127.0.0.1:{two_servers[0]},127.0.0.1:{closed}",
                 *GREEDY)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])  # not -6 (SIGABRT)
    assert res.stderr.strip().splitlines()[-1] == (
        f"dgchat: error: RPC server 127.0.0.1:{closed} is unreachable: connection refused "
        f"(is `dgchat rpc-server --host ... --port {closed}` running there?)")


@needs_rpc
def test_the_chat_app_does_not_open_with_an_unreachable_server() -> None:
    closed = free_port()
    res = dgchat("--rpc", f"127.0.0.1:{closed}")
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.strip().splitlines()[-1].startswith(
        f"dgchat: error: RPC server 127.0.0.1:{closed} is unreachable: connection refused")


@needs_rpc
def test_a_port_that_is_not_an_rpc_server_is_a_clear_error(llada_gguf: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up() -> None:
        conn, _ = listener.accept()
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    worker = threading.Thread(target=hang_up, daemon=True)
    worker.start()
    try:
        res = dgchat("generate", "-m", str(llada_gguf), "--rpc", f"127.0.0.1:{port}", *GREEDY)
    finally:
        listener.close()
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert f"RPC server 127.0.0.1:{port} did not complete llama.cpp's RPC handshake" in res.stderr


@needs_rpc
def test_a_public_address_warns_loudly_before_anything_else(llada_gguf: Path) -> None:
    # 198.20.0.1 is a public address (just past the 198.18.0.0/15 benchmark range); port 9 is discard
    res = dgchat("generate", "-m", str(llada_gguf), "--rpc", "198.20.0.1:9", *GREEDY, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("dgchat: WARNING: RPC server 198.20.0.1:9 is not on a loopback or private network")
    assert lines[-1].startswith("dgchat: error: RPC server 198.20.0.1:9 ")  # unreachable, or no handshake


@needs_rpc
@pytest.mark.slow
def test_a_server_gone_before_the_model_loads_is_a_clear_error(llada_gguf: Path) -> None:
    """Registered, then killed: the load greets it again instead of letting llama.cpp abort."""
    port = free_port()
    proc = start_server(port)
    script = (
        "import os, signal, sys\n"
        "from dgchat.model_backend import rpc\n"
        "from dgchat.model_backend.loader import load_engine\n"
        "from dgchat.model_backend.errors import DgchatError\n"
        f"rpc.connect('127.0.0.1:{port}')\n"
        f"os.kill({proc.pid}, signal.SIGKILL)\n"
        "import time; time.sleep(0.5)\n"
        "try:\n"
        f"    load_engine({str(llada_gguf)!r})\n"
        "except DgchatError as exc:\n"
        "    print('ERROR', exc); sys.exit(2)\n"
        "print('LOADED')\n"
    )
    try:
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr[-2000:])
    assert f"ERROR RPC server 127.0.0.1:{port} is unreachable: connection refused" in res.stdout


@needs_rpc
def test_rpc_server_refuses_a_taken_port_and_stops_on_ctrl_c() -> None:
    port = free_port()
    proc = start_server(port)
    try:
        taken = dgchat("rpc-server", "--port", str(port))
        assert taken.returncode == 2
        assert f"dgchat: error: cannot listen on 127.0.0.1:{port}:" in taken.stderr
    finally:
        err = stop_server(proc)
    assert proc.returncode == 130
    assert "serving CPU" in err and f"dgchat --rpc 127.0.0.1:{port}" in err and "rpc-server: stopped" in err


@needs_rpc
def test_rpc_server_on_every_interface_warns() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dgchat", "rpc-server", "--host", "0.0.0.0", "--port", str(port),
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(port, proc)
    finally:
        err = stop_server(proc)
    assert "dgchat: WARNING: listening on every network interface" in err


@needs_rpc
@pytest.mark.slow
def test_a_server_killed_mid_generation_ends_with_one_line_not_a_crash_dump(llada_gguf: Path) -> None:
    """llama.cpp aborts when a server stops answering mid-generation (nothing can save that
    process); dgchat turns the abort into its own error line, naming the server, and exit code 2."""
    port = free_port()
    proc = start_server(port)
    cli = subprocess.Popen([sys.executable, "-m", "dgchat", "generate", "-m", str(llada_gguf), "--rpc",
                            f"127.0.0.1:{port}", "-p", "Tell me a long story", "--gen-length", "64", "--steps", "64",
                            "--max-tokens", "1024", "--no-early-stop", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert cli.stderr is not None
        assert "model layers go to the RPC server(s)" in cli.stderr.readline()  # registered; loading, generating
        time.sleep(1.5)
        assert cli.poll() is None, "the generation ended before the server was killed: proves nothing"
        proc.kill()
        _, err = cli.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 2, (cli.returncode, err[-2000:])
    last = err.strip().splitlines()[-1]
    assert last == (f"dgchat: error: RPC server 127.0.0.1:{port} closed the connection or sent a malformed reply; "
                    "llama.cpp cannot go on without it (the generation in progress is lost)")
    assert "Backtrace" not in err and "#0 " not in err


@needs_rpc
@pytest.mark.slow
def test_npc_lines_with_rpc_are_the_local_lines(llada_gguf: Path, two_servers: list[int], tmp_path: Path) -> None:
    from fixtures.npc_files import CARDS, LINES

    cards, lines = tmp_path / "cards.toml", tmp_path / "lines.toml"
    cards.write_text(CARDS)
    lines.write_text(LINES)
    common = ["npc", "--cards", str(cards), "--template", str(lines), "-m", str(llada_gguf), "--count", "2"]
    local = dgchat(*common, "--out", str(tmp_path / "local.json"))
    assert local.returncode == 0, local.stderr
    spec = ",".join(f"127.0.0.1:{p}" for p in two_servers)
    remote = dgchat(*common, "--rpc", spec, "--verbose", "--out", str(tmp_path / "rpc.json"))
    assert remote.returncode == 0, remote.stderr[-3000:]
    for port in two_servers:
        assert f"RPC0[127.0.0.1:{port}] model buffer size" in remote.stderr
    texts = [[line["text"] for line in json.loads((tmp_path / f"{name}.json").read_text())["lines"]]
             for name in ("local", "rpc")]
    assert len(texts[0]) == 4 and texts[1] == texts[0]


async def test_the_chat_app_shows_the_untrusted_network_warning(tmp_path: Path, monkeypatch, llada_gguf: Path) -> None:
    """A warning that `--rpc` printed on stderr before the app took the terminal is also a notice in
    the app, where the user looks."""
    from dgchat.model_backend import rpc_probe
    from fixtures.app_harness import make_app, setup_home, wait_model

    setup_home(tmp_path, monkeypatch)
    warning = "RPC server 8.8.8.8:50052 is not on a loopback or private address: test warning"
    monkeypatch.setattr(rpc_probe.SERVERS, "warnings", [warning])
    app = make_app(llada_gguf)
    async with app.run_test(size=(110, 34)) as pilot:
        await wait_model(pilot)
        assert any(warning in str(n.message) for n in app._notifications)
