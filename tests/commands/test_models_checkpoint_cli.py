"""`dgchat models list|pull` with a checkpoint entry (a tiny real checkpoint on the local stand-in hub):
the download and disk sizes in the list, `pull --keep-checkpoint`, one-line errors. The kill-and-resume
cases run the same command in a child process: tests/hub/test_checkpoint_pull.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgchat.cli import main
from dgchat.hub import catalog as hub_catalog
from dgchat.hub import manager as hub_manager
from dgchat.hub.util import format_bytes
from fixtures import checkpoint_hub as ck
from fixtures.speed_profile import install_reference_profile

pytest.importorskip("tokenizers")


@pytest.fixture
def env(hub, hf_home: Path, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dgchat-home"
    monkeypatch.setenv("DGCHAT_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    install_reference_profile()
    ck.host(hub, base)
    path = ck.write_catalog(tmp_path / "catalog.toml", base)
    real = hub_catalog.load_catalog
    monkeypatch.setattr(hub_manager, "load_catalog", lambda p=None: real(path))
    return home / "data" / "models"


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["models", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_shows_download_and_disk_sizes(env: Path, base: Path, capsys) -> None:
    entry = hub_catalog.load_catalog(env.parents[2] / "catalog.toml").get(ck.NAME)
    rc, out, err = run(capsys, "list", "--no-measure", "--wide")  # DOWNLOAD and DISK: every column
    assert rc == 0, err
    header = next(line for line in out.splitlines() if line.lstrip().startswith("NAME"))
    assert header.split()[:8] == ["NAME", "SIZE", "DOWNLOAD", "DISK", "STATUS", "FIT", "ANSWER", "NEEDS"]
    line = next(line for line in out.splitlines() if ck.NAME + " " in line)
    # plain columns (stdout is not a terminal): each cell starts where its header does
    starts = [header.index(h) for h in ("NAME", "SIZE", "DOWNLOAD", "DISK", "STATUS", "FIT")]
    cells = [line[a:b].strip() for a, b in zip(starts, starts[1:])]
    assert cells == [ck.NAME, f"~{format_bytes(entry.size)}", f"~{format_bytes(entry.checkpoint_size)}",
                     f"~{format_bytes(2 * entry.checkpoint_size + entry.size)}", "available"]
    assert "DOWNLOAD: what comes over the network" in out
    rc, out, _ = run(capsys, "list", "--json", "--no-measure")
    row = {m["name"]: m for m in json.loads(out)["models"]}[ck.NAME]
    assert row["download_size"] == entry.checkpoint_size and row["disk_need"] == 2 * entry.checkpoint_size + entry.size
    assert row["checkpoint"]["quant"] == "Q4_K_M" and "config.json" in row["checkpoint"]["files"]
    assert row["needs_convert"] and row["size"] == entry.size and row["filename"] is None


def test_pull_keep_checkpoint_then_list_and_rm(env: Path, hub, base: Path, capsys) -> None:
    rc, out, err = run(capsys, "pull", ck.NAME, "--keep-checkpoint")
    assert rc == 0, err
    gguf = env / "tiny-llada-checkpoint-Q4_K_M.gguf"
    kept = env / "checkpoints" / "tiny-llada-checkpoint"
    assert f"installed {ck.NAME} (downloaded): {gguf}" in out
    assert "checked by converted and quantized to Q4_K_M from a checkpoint whose 7 files" in out
    assert "checkpoint: 7 files, " in out and f"commit {hub.repos[ck.REPO][:12]}; kept in {kept}" in out
    assert "note: chat_template.jinja is not in" in out
    assert gguf.exists() and (kept / "config.json").exists()
    assert not (env / ".partial" / f"{ck.NAME}.checkpoint").exists()
    for phase in ("downloading", "converting", "quantizing"):  # the phases on stderr (not a terminal here)
        assert f"{phase}: " in err, phase
    rc, out, _ = run(capsys, "list", "--json", "--no-measure")
    row = {m["name"]: m for m in json.loads(out)["models"]}[ck.NAME]
    assert row["status"] == "installed" and row["download_size"] == row["checkpoint"]["size"]
    assert row["disk_need"] == 0  # nothing to download any more
    rc, out, _ = run(capsys, "rm", ck.NAME)
    assert rc == 0 and f"deleted {gguf}" in out and kept.is_dir()


def test_pull_deletes_the_checkpoint_by_default(env: Path, capsys) -> None:
    rc, out, err = run(capsys, "pull", ck.NAME)
    assert rc == 0, err
    assert "deleted after the conversion (--keep-checkpoint keeps it)" in out
    assert not (env / "checkpoints").exists() and not (env / ".partial" / f"{ck.NAME}.checkpoint").exists()


def test_a_corrupt_file_is_one_line_and_a_retry_fetches_it(env: Path, hub, base: Path, capsys) -> None:
    shard = ck.weight_names(base)[0]
    hub.files[(ck.REPO, shard)].corrupt_at = 100
    rc, _, err = run(capsys, "pull", ck.NAME)
    errors = [line for line in err.splitlines() if line.startswith("dgchat:")]  # the rest: progress lines
    assert rc == 2 and len(errors) == 1 and err.endswith(errors[0] + "\n")
    assert errors[0].startswith(f"dgchat: error: {ck.REPO}: {shard} is corrupt: sha256 ")
    assert "the file was deleted, pull again to download it afresh" in err
    rc, out, _ = run(capsys, "list", "--json", "--no-measure")
    assert {m["name"]: m for m in json.loads(out)["models"]}[ck.NAME]["status"] == "partial"
    hub.files[(ck.REPO, shard)].corrupt_at = None
    rc, out, err = run(capsys, "pull", ck.NAME)
    assert rc == 0, err
