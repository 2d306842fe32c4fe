"""Fixtures of the app tests (Textual under Pilot); the harness they build on is fixtures.app_harness."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.app_harness import setup_home


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DGCHAT_HOME under tmp_path with a config (a fast sampler; no wizard), HOME = tmp_path.
    Test modules that need more (a server, a draft, the hub) define their own `home`."""
    return setup_home(tmp_path, monkeypatch)
