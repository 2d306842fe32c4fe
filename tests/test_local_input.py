"""Local input that crashed or hung dgchat (issue 31): thread counts, deeply nested TOML, a FIFO
given as a file, a relative export_dir. Each now gives one line (or works), within seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import GGML_MAX_N_THREADS, check_threads, max_threads
from dgchat.toml_files import MAX_TOML_DEPTH, TomlFileError, parse_toml, read_toml


def _dgchat(args: list[str], tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m dgchat ARGS` with a home of its own; stdin closed (no prompt is read from it)."""
    env = {"DGCHAT_HOME": str(tmp_path / "dgchat-home"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": ":".join(p for p in sys.path if p), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "dgchat", *args], env=env, capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _one_error_line(run: subprocess.CompletedProcess) -> str:
    err = run.stderr.decode()
    lines = [line for line in err.splitlines() if line.startswith("dgchat: error: ")]
    assert run.returncode == 2, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


# -- threads --------------------------------------------------------------------------------------------

def test_the_thread_bound_is_four_per_core_and_at_most_llama_cpps():
    cores = os.cpu_count() or 1
    assert max_threads() == min(4 * cores, GGML_MAX_N_THREADS)
    assert check_threads(None) is None and check_threads(max_threads()) == max_threads()
    for bad in (0, -1, max_threads() + 1, 100_000, True, 2.0, "4"):
        with pytest.raises(InvalidParameterError, match=rf"n_threads must be a whole number from 1 to {max_threads()}"):
            check_threads(bad, "n_threads")


@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["npc", "--list-cards"], ["serve"], ["bench"],
                                     ["rpc-server"], ["convert", "in", "out.gguf"]])
def test_threads_100000_is_one_line_naming_the_flag_and_the_range(tmp_path, command, capsys):
    from dgchat.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([command[0], "--threads", "100000", *command[1:]])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("dgchat: error:")]
    assert line == (f"dgchat: error: argument --threads: must be a whole number from 1 to {max_threads()} "
                    "(4 per core on this machine; got 100000)")


def test_n_threads_in_the_config_is_bounded_too(tmp_path):
    from dgchat.config import ConfigError, load_config

    path = tmp_path / "config.toml"
    path.write_text("n_threads = 100000\n")
    with pytest.raises(ConfigError, match=rf"n_threads must be a whole number from 1 to {max_threads()} "):
        load_config(path)
    path.write_text(f"n_threads = {max_threads()}\n")
    assert load_config(path).n_threads == max_threads()


def test_the_app_with_n_threads_100000_stops_with_one_line(tmp_path):
    home = tmp_path / "dgchat-home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("n_threads = 100000\n")
    line = _one_error_line(_dgchat([], tmp_path))
    assert "config.toml: n_threads must be a whole number from 1 to" in line


def test_the_engine_refuses_a_thread_count_before_llama_cpp_sees_it(llada_gguf):
    """Callers that bypass the flags and the config (bench workers, distillation) meet the same bound."""
    from dgchat.model_backend.loader import load_engine

    with pytest.raises(InvalidParameterError, match="threads must be a whole number"):
        load_engine(llada_gguf, n_threads=100_000)


# -- deeply nested TOML ---------------------------------------------------------------------------------

DEEP = {
    "arrays": "a = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "inline tables": "a = " + "{b = " * 100_000 + "1" + "}" * 100_000 + "\n",
    "dotted key": "a" + ".a" * 100_000 + " = 1\n",  # tomllib: quadratic time and memory, not recursion
    "table header": "[" + ".".join(["t"] * 100_000) + "]\n",
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_deep_toml_is_refused_in_one_line_quickly(name):
    started = time.monotonic()
    with pytest.raises(TomlFileError) as info:
        parse_toml(DEEP[name])
    assert info.value.kind == "depth" and f"nested more than {MAX_TOML_DEPTH} levels deep" in str(info.value)
    assert "\n" not in str(info.value)
    assert time.monotonic() - started < 5


def test_nesting_within_the_bound_and_brackets_in_strings_and_comments_are_fine():
    ok = ("a = " + "[" * MAX_TOML_DEPTH + "]" * MAX_TOML_DEPTH + "\n"
          + 'b = "' + "[" * 1000 + '"\n' + "c = '''\n" + "{" * 1000 + "\n'''\n" + "# " + "[" * 1000 + "\n"
          + '[x.y]\n"q.r".s = 1.5\n')
    data = parse_toml(ok)
    assert data["b"] == "[" * 1000 and data["x"]["y"]["q.r"]["s"] == 1.5
    with pytest.raises(TomlFileError, match="nested more than"):
        parse_toml("a = " + "[" * (MAX_TOML_DEPTH + 1) + "]" * (MAX_TOML_DEPTH + 1))


def test_the_nesting_of_the_parsed_value_is_checked_too():
    """Tables nest through headers and dotted keys together: [a.b...] then c.d... = 1 is measured
    on the value tomllib returns."""
    half = MAX_TOML_DEPTH // 2 + 1
    text = "[" + ".".join(["t"] * half) + "]\n" + ".".join(["k"] * half) + " = 1\n"
    with pytest.raises(TomlFileError, match="nested more than"):
        parse_toml(text)


def test_a_hostile_toml_file_is_scanned_in_bounded_time():
    """Unterminated strings and long words: the depth scan consumes each token once."""
    for text in ('"' + '\\"' * 1_000_000, '"""' + 'x""' * 500_000, "a" * 2_000_000, "'" * 2_000_000):
        started = time.monotonic()
        with pytest.raises(TomlFileError):
            parse_toml(text)
        assert time.monotonic() - started < 5


def test_a_deep_config_card_and_lines_file_each_give_one_line(tmp_path):
    from dgchat.config import ConfigError, load_config
    from dgchat.npc.cards import load_card_file
    from dgchat.npc.errors import CardError, LinesFileError
    from dgchat.npc.lines_file import load_lines_file

    deep = tmp_path / "deep.toml"
    deep.write_text(DEEP["arrays"])
    with pytest.raises(ConfigError, match=r"deep.toml: nested more than 32 levels deep \(line 1"):
        load_config(deep)
    with pytest.raises(CardError, match="deep.toml: nested more than 32 levels deep"):
        load_card_file(deep)
    with pytest.raises(LinesFileError, match="deep.toml: nested more than 32 levels deep"):
        load_lines_file(deep)


def test_npc_with_a_deep_card_prints_one_line(tmp_path):
    card = tmp_path / "card.toml"
    card.write_text('name = "x"\nexamples = ' + "[" * 100_000 + "\n")
    line = _one_error_line(_dgchat(["npc", "--cards", str(card), "--list-cards"], tmp_path))
    assert line.startswith(f"dgchat: error: {card}: nested more than 32 levels deep")


def test_a_huge_toml_file_is_refused_by_its_size(tmp_path):
    big = tmp_path / "big.toml"
    with big.open("wb") as f:
        f.truncate(5 << 20)  # sparse: 5 MiB of NUL without writing them
    with pytest.raises(TomlFileError, match="the limit is") as info:
        read_toml(big)
    assert info.value.kind == "too-large"


# -- regular files only ---------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_as_a_card_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "card.toml"
    os.mkfifo(fifo)
    started = time.monotonic()
    run = _dgchat(["npc", "--cards", str(fifo), "--list-cards"], tmp_path, timeout=30)
    line = _one_error_line(run)
    assert line == f"dgchat: error: {fifo}: is a FIFO (named pipe), not a regular file"
    assert time.monotonic() - started < 30


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_as_a_lines_file_config_or_card_in_the_workshop_folder_is_refused(tmp_path, monkeypatch):
    from dgchat.config import ConfigError, load_config
    from dgchat.app.npc_cards import load_shelf
    from dgchat.hub.errors import HubError
    from dgchat.hub.hardware import load_hardware_overrides
    from dgchat.npc.errors import LinesFileError
    from dgchat.npc.lines_file import load_lines_file

    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(LinesFileError, match="is a FIFO"):
        load_lines_file(fifo)
    with pytest.raises(ConfigError, match="is a FIFO"):
        load_config(fifo)
    with pytest.raises(HubError, match="is a FIFO"):
        load_hardware_overrides(fifo)
    # the workshop reads every *.toml of its folder: the FIFO is reported, the good card still loads
    folder = tmp_path / "cards"
    folder.mkdir()
    os.mkfifo(folder / "a-pipe.toml")
    (folder / "guard.toml").write_text('name = "Brann"\n')
    shelf = load_shelf(folder)
    assert [c.name for c in shelf.cards] == ["Brann"]
    assert shelf.errors == ["a-pipe.toml: is a FIFO (named pipe), not a regular file"]


def test_a_device_is_not_a_config_either(tmp_path):
    with pytest.raises(TomlFileError, match="is a character device, not a regular file"):
        read_toml("/dev/zero")  # would never end


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_writing_the_config_refuses_a_fifo_there_instead_of_blocking(tmp_path):
    from dgchat.config import ConfigError
    from dgchat.config import save_default_model

    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a FIFO"):
        save_default_model(fifo, "/models/m.gguf")


# -- export_dir -----------------------------------------------------------------------------------------

def test_a_relative_export_dir_is_inside_home_and_applied_once(tmp_path, monkeypatch):
    """export_dir = "exports": the dialog's default file is ~/exports/dgchat-1-....md, and accepting
    it writes there (it used to be taken relative to the folder once more: exports/exports/...)."""
    from dgchat.config import load_config
    from dgchat.app.export import default_export_path, export_chat, export_dir, export_target
    from dgchat.app.store import Store

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    elsewhere = tmp_path / "started-here"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where dgchat was started must not matter
    path = tmp_path / "config.toml"
    path.write_text('export_dir = "exports"\n')
    config = load_config(path)
    assert config.export_dir == str(home / "exports")
    folder = export_dir(config.export_dir)
    assert folder == home / "exports"
    with Store(tmp_path / "chats.db") as store:
        chat = store.create_chat("gate")
        store.add_message(chat.id, "user", "hello")
        shown = str(default_export_path(chat, folder))  # what the dialog offers
        target = export_target(shown, folder)  # what Enter on it writes
        assert target == home / "exports" / f"dgchat-{chat.id}-gate.md"
        written = export_chat(chat, store.messages(chat.id), target)
    assert written.is_file() and not (home / "exports" / "exports").exists() and not any(elsewhere.iterdir())
    # a relative name typed in the dialog is still inside the folder, once
    assert export_target("notes/chat.md", folder) == home / "exports" / "notes" / "chat.md"
