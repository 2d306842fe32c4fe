"""`dgchat models ...` as a user runs it, against the local hub (HF_ENDPOINT), including a pull that
is killed or interrupted mid-transfer and resumed by a new process."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dgchat.cli import main
from fixtures.cli_terminal import InTerminal, pipe_env
from fixtures.speed_profile import install_reference_profile
from fixtures.hub_fixtures import model_bytes, model_file

LLADA = ("mradermacher/LLaDA-8B-Instruct-GGUF", "LLaDA-8B-Instruct.Q4_K_M.gguf")
NAME = "llada-8b-instruct-q4_k_m"


@pytest.fixture
def env(hub, hf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dgchat-home"
    monkeypatch.setenv("DGCHAT_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    install_reference_profile()  # `models list` predicts speeds: never measured in a test
    hub.add_file(*LLADA, model_bytes())
    return home


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["models", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_pull_list_verify_rm(env: Path, hub, capsys) -> None:
    rc, out, err = run(capsys, "pull", NAME)
    assert rc == 0, err
    assert f"installed {NAME} (downloaded): {env / 'data' / 'models' / LLADA[1]}" in out
    assert "checked by hub LFS etag" in out
    n = len(hub.log)
    rc, out, _ = run(capsys, "list", "--json")
    listing = json.loads(out)
    models = {m["name"]: m for m in listing["models"]}
    assert models[NAME]["status"] == "installed" and models[NAME]["fit"] in (
        "fits in VRAM", "fits in RAM", "will not fit")
    assert listing["recommended"] in models and listing["hardware"]["cpu_cores"] >= 1
    rc, out, _ = run(capsys, "list")
    assert rc == 0 and NAME in out and "installed" in out and "recommended for this machine" in out
    rc, out, _ = run(capsys, "verify")
    assert rc == 0 and f"ok {NAME}" in out
    assert len(hub.log) == n  # list and verify stay offline
    rc, out, _ = run(capsys, "rm", NAME)
    assert rc == 0 and "deleted" in out and not (env / "data" / "models" / LLADA[1]).exists()


def test_errors_are_one_line(env: Path, hub, tmp_path: Path, capsys) -> None:
    rc, _, err = run(capsys, "pull", "no-such-model")
    assert rc == 2 and err.startswith("dgchat: error: no model named 'no-such-model'") and err.count("\n") == 1
    junk = tmp_path / "junk.gguf"
    junk.write_text("hello")
    rc, _, err = run(capsys, "import", str(junk))
    assert rc == 2 and "not a GGUF file" in err
    rc, _, err = run(capsys, "rm", "nothing")
    assert rc == 2 and "no installed model named 'nothing'" in err
    rc, _, err = run(capsys, "verify", "nothing")
    assert rc == 2 and "no installed model named 'nothing'" in err
    hub.files.pop(LLADA)
    hub.add_file(LLADA[0], "something-else.gguf", b"x")
    rc, _, err = run(capsys, "pull", NAME)
    assert rc == 2 and "no file 'LLaDA-8B-Instruct.Q4_K_M.gguf' in mradermacher/LLaDA-8B-Instruct-GGUF" in err
    rc, out, _ = run(capsys, "list", "--json")
    assert {m["name"]: m for m in json.loads(out)["models"]}[NAME]["status"] == "available"


def test_gated_repo_login_then_pull(env: Path, hub, hf_home: Path, capsys) -> None:
    hub.gate(LLADA[0], "hf_good", user="alice")
    rc, _, err = run(capsys, "pull", NAME)
    assert rc == 2 and "is gated" in err and "dgchat models login" in err
    rc, _, err = run(capsys, "login", "--token", "hf_bad")
    assert rc == 2 and "rejected this token (HTTP 401)" in err
    assert not (hf_home / "token").exists()
    rc, out, err = run(capsys, "login", "--token", "hf_good")
    assert rc == 0, err
    assert "token stored for alice as 'dgchat-test'" in out
    token_file = hf_home / "token"
    assert token_file.read_text() == "hf_good" and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert "[dgchat-test]" in (hf_home / "stored_tokens").read_text()
    from huggingface_hub import get_token

    assert get_token() == "hf_good"  # every huggingface_hub tool sees it
    rc, out, err = run(capsys, "pull", NAME)
    assert rc == 0, err
    resolves = [r for r in hub.requests(prefix=f"/{LLADA[0]}/resolve/") if r.status in (200, 302)]
    assert resolves and all(r.authorization == "Bearer hf_good" for r in resolves)
    assert all(r.authorization is None for r in hub.cdn_gets())


def test_import_and_hardware(env: Path, capsys) -> None:
    rc, out, err = run(capsys, "import", str(model_file()), "--name", "tiny")
    assert rc == 0, err
    assert out.startswith("imported tiny: ") and "(llada," in out
    rc, out, err = run(capsys, "hardware", "--ram", "16G", "--vram", "8G", "--gpu-offload", "yes")
    assert rc == 0, err
    assert "RAM:          16.0 GiB" in out and "8.0 GiB VRAM" in out and "GPU offload:  yes" in out
    rc, out, _ = run(capsys, "list", "--json")
    listing = json.loads(out)
    assert listing["hardware"]["ram_total"] == 16 * 1024**3 and listing["hardware"]["gpu_offload"] is True
    tiny = {m["name"]: m for m in listing["models"]}["tiny"]
    assert tiny["status"] == "installed" and tiny["fit"] == "fits in VRAM"
    rc, out, _ = run(capsys, "list", "--json", "--ram", "1G", "--no-gpu")  # this run only
    assert json.loads(out)["hardware"]["ram_total"] == 1024**3
    rc, out, _ = run(capsys, "hardware", "--reset", "--json")
    assert json.loads(out)["overridden"] == []


def _dgchat(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dgchat", "models", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_part(part: Path, size: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if part.exists() and part.stat().st_size >= size:
            return
        if proc.poll() is not None:
            raise AssertionError(f"pull ended early: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError(f"{part} never reached {size} bytes")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_stopped_process_resumes_in_a_new_one(env: Path, hub, how: str) -> None:
    stall = 1_800_000
    hub.files[LLADA].stall_at = stall
    part = env / "data" / "models" / ".partial" / f"{LLADA[1]}.part"
    proc = _dgchat("pull", NAME)
    try:
        assert hub.stalled.wait(60), proc.communicate()
        _wait_for_part(part, stall, proc)
        os.kill(proc.pid, getattr(signal, how))
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if how == "SIGINT":
        assert proc.returncode == 130 and "paused at" in err and "pull it again to resume" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    hub.files[LLADA].stall_at = None
    hub.release_stall.set()
    assert part.stat().st_size == stall and part.with_name(part.name + ".json").exists()
    listing = subprocess.run([sys.executable, "-m", "dgchat", "models", "list", "--json"], capture_output=True,
                             text=True, timeout=60)
    assert {m["name"]: m for m in json.loads(listing.stdout)["models"]}[NAME]["status"] == "partial"
    n = len(hub.cdn_gets())
    again = subprocess.run([sys.executable, "-m", "dgchat", "models", "pull", NAME], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert [g.range for g in hub.cdn_gets()[n:]] == [f"bytes={stall}-"]
    assert (env / "data" / "models" / LLADA[1]).read_bytes() == model_bytes()


# -- the table at a terminal's width (issue 43, item 16) --------------------------------------------

SAME_MACHINE = ("--ram", "24G", "--no-gpu")  # the reference profile's machine, whatever runs the test


def _list_in_a_terminal(cols: int, *args: str) -> str:
    """`dgchat models list ARGS` in a terminal `cols` columns wide: what it wrote, without colours."""
    run = InTerminal("models", "list", *args, cols=cols)
    rc, err = run.finish(timeout=60)
    assert rc == 0, err
    return run.text


def _answer_times(env_json: dict) -> dict[str, str]:
    """Each model's ANSWER cell as the hub words it ("~6 min", "~19 s", "-")."""
    from dgchat.hub.speed import duration_words

    def words(m: dict) -> str:
        if not m["predicted"]:
            return "-"
        said = duration_words(m["predicted"]["seconds_per_answer"])
        return said if said.startswith("<") else "~" + said

    return {m["name"]: words(m) for m in env_json["models"]}


def _rows(out: str, names: list[str]) -> dict[str, str]:
    """name -> its row of the table (names are whole at these widths)."""
    rows = {}
    for line in out.splitlines():
        cells = line.lstrip("* ").split("  ")
        if cells[0] in names:
            rows[cells[0]] = line
    return rows


def test_list_fits_an_80_column_terminal_with_whole_answer_times(env: Path) -> None:
    listing = json.loads(subprocess.run([sys.executable, "-m", "dgchat", "models", "list", "--json", *SAME_MACHINE],
                                        capture_output=True, text=True, timeout=60, check=True).stdout)
    times = _answer_times(listing)
    assert sum(t != "-" for t in times.values()) >= 5, times  # predictions to show: proves something
    out = _list_in_a_terminal(80, *SAME_MACHINE)
    too_long = [line for line in out.splitlines() if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    assert "…" not in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("NAME"))
    assert header.split() == ["NAME", "SIZE", "STATUS", "FIT", "ANSWER"]
    rows = _rows(out, list(times))
    assert set(rows) == set(times), out  # every model, its name whole
    for name, line in rows.items():
        assert line.rstrip().endswith(f"  {times[name]}"), line  # the answer time, whole, last
    assert "too slow " in out and "in RAM " in out  # the fit badge, in fewer words
    assert f"recommended for this machine: {listing['recommended']}" in out
    assert "`--wide`" in out
    # a pipe (nothing says its width: 80 columns) gets the same table
    piped = subprocess.run([sys.executable, "-m", "dgchat", "models", "list", *SAME_MACHINE], capture_output=True,
                           text=True, timeout=60, env={k: v for k, v in pipe_env().items() if k != "COLUMNS"},
                           check=False)
    assert piped.returncode == 0, piped.stderr
    assert max(len(line) for line in piped.stdout.splitlines()) <= 80
    assert _rows(piped.stdout, list(times)) == {name: line.rstrip() for name, line in rows.items()}


def test_list_shows_every_column_where_there_is_room_or_with_wide(env: Path) -> None:
    out = _list_in_a_terminal(200, *SAME_MACHINE)
    header = next(line for line in out.splitlines() if line.lstrip().startswith("NAME"))
    assert header.split() == ["NAME", "SIZE", "DOWNLOAD", "DISK", "STATUS", "FIT", "ANSWER", "NEEDS"]
    assert "too slow here" in out and "fits in RAM" in out and "`--wide`" not in out
    assert max(len(line) for line in out.splitlines()) <= 200
    # --wide at 80: every column, nothing cut (the lines are longer than the terminal, as asked)
    wide = _list_in_a_terminal(80, "--wide", *SAME_MACHINE)
    header = next(line for line in wide.splitlines() if line.lstrip().startswith("NAME"))
    assert header.split() == ["NAME", "SIZE", "DOWNLOAD", "DISK", "STATUS", "FIT", "ANSWER", "NEEDS"]
    assert "…" not in wide and "diffusiongemma-26b-a4b-q4_k_m " in wide


# -- a GPU this machine does not have (issue 45) ------------------------------------------------------

GPU_12G = ("--ram", "24G", "--vram", "12G")  # the reference profile's CPU with a 12 GiB GPU beside it
DG_Q4 = "diffusiongemma-26b-a4b-q4_k_m"


def test_list_for_a_12_gib_gpu_keeps_diffusion_gemmas_experts_in_ram(env: Path) -> None:
    """Issue 45's done-criterion: on any machine (the one the project runs on has no GPU) `--vram 12G`
    answers as for a GPU with 12 GiB free: DiffusionGemma Q4_K_M (16.9 GB) fits with the experts of
    some layers in RAM, with a predicted time, estimated, and the step's parts on both routes."""
    done = subprocess.run([sys.executable, "-m", "dgchat", "models", "list", "--json", *GPU_12G],
                          capture_output=True, text=True, timeout=60, check=True)
    listing = json.loads(done.stdout)
    assert listing["hardware"]["vram_free"] == 12 * 1024**3 and listing["hardware"]["gpu_offload"]
    dg = {m["name"]: m for m in listing["models"]}[DG_Q4]
    assert dg["fit"] == "fits with experts in RAM" and "the experts of" in dg["fit_reason"]
    assert dg["placement"]["mode"] == "experts-in-ram" and 0 < len(dg["placement"]["experts_in_ram"]) < 30
    predicted = dg["predicted"]
    assert predicted["device"] == "gpu+cpu" and predicted["seconds_per_answer"] > 0
    assert predicted["basis"].startswith("estimated")
    assert predicted["step"]["route"] == "copy" and predicted["other_route"]["route"] == "cpu"
    assert "layers in RAM" in dg["speed"]
    # the table says it in fewer words, with the same time
    piped = subprocess.run([sys.executable, "-m", "dgchat", "models", "list", *GPU_12G], capture_output=True,
                           text=True, timeout=60, env={k: v for k, v in pipe_env().items() if k != "COLUMNS"},
                           check=True)
    row = _rows(piped.stdout, [DG_Q4])[DG_Q4]
    assert " experts in RAM " in row and row.endswith(_answer_times(listing)[DG_Q4])
    assert "FIT: experts in RAM: every layer on the GPU" in piped.stdout


@pytest.mark.parametrize("value", ["12X", "-3G", "twelve"])
def test_a_bad_vram_is_one_line_naming_the_option(env: Path, capsys, value: str) -> None:
    rc, _, err = run(capsys, "list", f"--vram={value}")
    assert rc == 2 and err.startswith(f"dgchat: error: --vram: not a size: '{value}'") and err.count("\n") == 1
