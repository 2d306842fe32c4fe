"""Snapshots (pytest-textual-snapshot) of the Models screen (F4) at 140x40, 80x24 and 60x20, and of
the question before a download.

Deterministic: fixed hardware (tests/fixtures/wizard_harness.py), HOME and DGCHAT_HOME under
tmp_path (paths print as ~/…), the fixture model as the bundled one, no network.
Update with `pytest tests/app/test_models_screen_snapshots.py --snapshot-update` and review the SVGs.
"""

from __future__ import annotations

import pytest
from fixtures.app_harness import FAST_SAMPLER, make_app, wait_for
from fixtures.wizard_harness import DREAM_NAME, first_run_home


@pytest.fixture
def env(tmp_path, monkeypatch):
    home = first_run_home(tmp_path, monkeypatch)
    (home / "config" / "config.toml").write_text(FAST_SAMPLER, encoding="utf-8")
    return home


async def _open_models(pilot) -> None:
    from dgchat.app.models_screen import ModelsScreen

    app = pilot.app
    await wait_for(pilot, lambda: app.session.engine is not None and app.session.loading_path is None)
    await pilot.press("f4")
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen) and bool(app.screen.rows))
    await pilot.pause()


def _select(name: str):
    async def run(pilot) -> None:
        screen = pilot.app.screen
        screen.query_one("#models-table").move_cursor(row=[r.name for r in screen.rows].index(name))
        await pilot.pause()
    return run


def _steps(*steps):
    async def run_before(pilot) -> None:
        await pilot.pause()
        for step in steps:
            await step(pilot)
        await pilot.pause(0.1)
    return run_before


@pytest.mark.parametrize("size", [(140, 40), (80, 24), (60, 20)], ids=["140x40", "80x24", "60x20"])
def test_models_screen_bundled_row(snap_compare, env, size):
    """The model in use (the bundled one) selected: only Use and Import apply."""
    assert snap_compare(make_app(None), terminal_size=size, run_before=_steps(_open_models))


@pytest.mark.parametrize("size", [(140, 40), (80, 24), (60, 20)], ids=["140x40", "80x24", "60x20"])
def test_models_screen_download_row(snap_compare, env, size):
    """A catalog model that is not here yet selected: Use and Pull (both ask first), Import."""
    assert snap_compare(make_app(None), terminal_size=size, run_before=_steps(_open_models, _select(DREAM_NAME)))


def test_the_question_before_a_download(snap_compare, env):
    async def ask(pilot) -> None:
        from dgchat.app.confirm_modal import ConfirmModal

        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmModal))

    assert snap_compare(make_app(None), terminal_size=(80, 24),
                        run_before=_steps(_open_models, _select(DREAM_NAME), ask))
