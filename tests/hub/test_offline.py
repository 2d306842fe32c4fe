"""Offline by default: no hub request unless the user asks for a download."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dgchat.hub.offline import enforce_offline, hub_network, is_offline
from fixtures.hub_fixtures import FILE, REPO


def test_enforce_offline_blocks_huggingface_hub(hub, hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # as if the user had it off
    enforce_offline()
    assert is_offline() and __import__("os").environ["HF_HUB_OFFLINE"] == "1"
    with pytest.raises((LocalEntryNotFoundError, OfflineModeIsEnabled)):
        hf_hub_download(REPO, FILE, endpoint=hub.endpoint, cache_dir=str(hf_home / "hub"))
    assert hub.log == []


def test_hub_network_is_scoped_and_counted(hf_home: Path) -> None:
    assert is_offline()
    with hub_network():
        assert not is_offline()
        with hub_network():
            assert not is_offline()
        assert not is_offline()
    assert is_offline()
    # two concurrent downloads: offline again only when both are done
    entered, release = threading.Barrier(3), threading.Event()

    def work() -> None:
        with hub_network():
            entered.wait()
            release.wait(5)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    entered.wait()
    assert not is_offline()
    release.set()
    for t in threads:
        t.join()
    assert is_offline()


def test_a_download_restores_offline_mode_even_when_it_fails(hub, hf_home: Path, tmp_path: Path) -> None:
    from dgchat.hub.download import download_file
    from dgchat.hub.errors import NotFoundOnHubError

    download_file(REPO, FILE, tmp_path / "a.gguf", endpoint=hub.endpoint)
    assert is_offline()
    with pytest.raises(NotFoundOnHubError):
        download_file(REPO, "nope.gguf", tmp_path / "b.gguf", endpoint=hub.endpoint)
    assert is_offline()


def test_the_cli_forces_offline_mode(hub, hf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with HF_HUB_OFFLINE unset by the user, `dgchat` (here: models list, and a stray hub call
    made after the CLI started) sends nothing to the hub."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path / "home"))
    code = (
        "import sys\n"
        "from dgchat.cli import main\n"
        "assert main(['models', 'list', '--json']) == 0\n"
        "from huggingface_hub import hf_hub_download\n"
        "try:\n"
        f"    hf_hub_download({REPO!r}, {FILE!r})\n"
        "except Exception as exc:\n"
        "    print('refused:', type(exc).__name__, file=sys.stderr)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "refused: LocalEntryNotFoundError" in res.stderr or "refused: OfflineModeIsEnabled" in res.stderr
    assert hub.log == []
