"""`dgchat npc` end to end, as a build pipeline runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dgchat.npc.export import read_csv_lines, validate_export
from fixtures.npc_files import CARDS, LINES


def dgchat(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", "npc", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    cards, lines = tmp_path / "cards.toml", tmp_path / "lines.toml"
    cards.write_text(CARDS)
    lines.write_text(LINES)
    return cards, lines


def test_npc_writes_json_and_csv_that_reproduce(files, tmp_path: Path, llada_gguf: Path) -> None:
    cards, lines = files
    common = ["--cards", str(cards), "--template", str(lines), "-m", str(llada_gguf), "--threads", "1"]
    res = dgchat(*common, "--count", "2", "--out", str(tmp_path / "lines.json"))
    assert res.returncode == 0, res.stderr
    assert "4 lines from 2 entries written" in res.stderr
    doc = json.loads((tmp_path / "lines.json").read_text(encoding="utf-8"))
    validate_export(doc)
    assert [line["id"] for line in doc["lines"]] == [
        "gate_guard.gate_night.0", "gate_guard.gate_night.1", "mira_the_baker.greeting.10",
        "mira_the_baker.greeting.11"]
    for line in doc["lines"][:2]:
        assert line["text"].startswith("Halt, Aria! None may pass the ") and line["text"].endswith(" after dark.")
        assert line["variables"] == {"player": "Aria"} and len(line["holes"]) == 1
    res = dgchat(*common, "--count", "2", "--out", str(tmp_path / "lines.csv"))
    assert res.returncode == 0, res.stderr
    rows = read_csv_lines((tmp_path / "lines.csv").read_bytes().decode("utf-8"))
    assert rows == doc["lines"]  # a second run, the same lines


@pytest.mark.parametrize("args, message", [
    (["--var", "player", "--out", "x.json"], "--var needs NAME=VALUE"),
    (["--out", "lines.txt"], "--out lines.txt: use a .json or .csv file name"),
    ([], "give the export file"),
])
def test_npc_argument_errors(files, args: list[str], message: str) -> None:
    cards, lines = files
    res = dgchat("--cards", str(cards), "--template", str(lines), *args)
    assert res.returncode == 2 and f"dgchat: error: {message}" in res.stderr, res.stderr


def test_npc_file_errors_name_the_entry(files, tmp_path: Path) -> None:
    cards, lines = files
    lines.write_text(LINES.replace("Halt, {player}!", "Halt, {hero}!"))
    res = dgchat("--cards", str(cards), "--template", str(lines), "--out", str(tmp_path / "x.json"))
    assert res.returncode == 2
    assert ("lines.toml [[line]] 1: template 'Halt, {hero}! None may pass the {___:2}…' uses {hero} "
            "but no variable 'hero'") in res.stderr
    assert not (tmp_path / "x.json").exists()
    res = dgchat("--cards", str(cards), "--list-cards")
    assert res.returncode == 0 and res.stdout.splitlines()[0].startswith("gate_guard\tCaptain Brann\t")
