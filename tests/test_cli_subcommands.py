"""cli.py's table of subcommands: one-line helps as the commands give them, and a command's module
imported only when that command runs (`dgchat --help` loads no engine, server or UI)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from dgchat.cli import SUBCOMMANDS, command_module

HEAVY = ("llama_cpp", "textual", "dgchat.app.app", "dgchat.server.app")


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_table_help_is_the_commands_own(name: str) -> None:
    sub = argparse.ArgumentParser(prog="dgchat").add_subparsers()
    command_module(name).add_parser(sub)
    helps = {action.dest: action.help for action in sub._choices_actions}
    assert helps == {name: SUBCOMMANDS[name][1]}


def _modules_after(argv: list[str]) -> list[str]:
    """The modules `dgchat ARGV` has imported when it exits (argv ends in --help)."""
    code = ("import json, sys\nfrom dgchat.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(json.dumps(sorted(sys.modules)))" % (argv,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stderr)


def test_top_level_help_imports_no_command() -> None:
    modules = _modules_after(["--help"])
    assert not [m for m in modules if m.startswith("dgchat.commands.") and m != "dgchat.commands.common"]
    assert not [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY]


def test_a_commands_help_imports_that_command_only() -> None:
    modules = _modules_after(["models", "list", "--help"])
    commands = {m for m in modules if m.startswith("dgchat.commands.")}
    assert commands == {"dgchat.commands.common", "dgchat.commands.models"}
    assert "textual" not in modules


@pytest.mark.parametrize("name", ["generate", "serve", "npc", "models", "convert"])
def test_a_commands_help_loads_no_engine(name: str) -> None:
    # llama.cpp's shared library (and the HTTP server) load when a command runs a model, not for its --help
    modules = _modules_after([name, "--help"])
    assert not [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY]


@pytest.mark.parametrize("argv", [[], *([name] for name in SUBCOMMANDS)], ids=lambda argv: " ".join(argv) or "dgchat")
def test_rpc_help_asks_for_no_special_engine_build(argv: list[str]) -> None:
    """`--rpc` (issue 43, item 15): the default engine build has the RPC backend (engine/build.py adds
    -DGGML_RPC=ON unless --no-rpc), so no help may send people to rebuild with `build.py --rpc`."""
    done = subprocess.run([sys.executable, "-m", "dgchat", *argv, "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"}, check=False)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps the help: a phrase may span two lines
    if "[--rpc HOST:PORT" not in text:
        return  # this command takes no --rpc (its usage line would show it)
    assert "build.py --rpc" not in text
    assert "the default engine build includes RPC" in text
