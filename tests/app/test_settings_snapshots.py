"""Snapshots of the chat settings and the model picker at 140x40, 80x24 and 60x20.

The app runs the bundled model (its path is the same on every machine), HOME and DGCHAT_HOME are
under tmp_path and the Hugging Face cache is empty, so the picker lists the same models
everywhere. Update with `pytest tests/app/test_settings_snapshots.py --snapshot-update` and review
the SVGs under __snapshots__.
"""

from __future__ import annotations

import pytest
from dgchat.app.model_picker import ModelPicker
from dgchat.assets import bundled_model_path
from fixtures.app_harness import make_app, setup_home, wait_for, wait_model

SIZES = [(140, 40), (80, 24), (60, 20)]


@pytest.fixture
def home(tmp_path, monkeypatch, hf_home):
    return setup_home(tmp_path, monkeypatch)


async def _open_settings(pilot) -> None:
    await wait_model(pilot)
    await pilot.press("ctrl+o")
    await pilot.pause(0.2)


async def _open_picker(pilot) -> None:
    await _open_settings(pilot)
    await pilot.click("#choose-model")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModelPicker) and pilot.app.screen.loaded,
                   what="the model picker's list")
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_settings(snap_compare, home, size):
    assert snap_compare(make_app(bundled_model_path()), terminal_size=size, run_before=_open_settings)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_settings_with_a_bad_number(snap_compare, home, size):
    async def bad_steps(pilot) -> None:
        await _open_settings(pilot)
        pilot.app.screen.query_one("#field-steps").focus()
        await pilot.press("backspace", "backspace", "x")
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)

    assert snap_compare(make_app(bundled_model_path()), terminal_size=size, run_before=bad_steps)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_model_picker(snap_compare, home, size):
    assert snap_compare(make_app(bundled_model_path()), terminal_size=size, run_before=_open_picker)
